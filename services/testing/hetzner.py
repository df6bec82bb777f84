"""A local HTTP fake of the Hetzner Cloud API endpoints the hetzner provider calls.

The provider is tested through the real ``hcloud`` client (``endpointUrl`` pointing here), so
request encoding, error decoding and paging are the library's own, not a mock's. The fake follows
Hetzner's public API reference for the calls used: servers create/get/list (``name``,
``label_selector``, ``page``/``per_page``)/delete, firewalls create/get/list/delete and
``actions/set_rules``, actions get, server types (list by ``name``, get) and images (list by
``name``, ``architecture``, ``type``, get); Bearer tokens (401 ``unauthorized`` for a wrong one);
Hetzner's error shape ``{"error": {"code", "message", "details"}}``; the ``RateLimit-*``
headers on every answer.

Servers start ``initializing`` and are ``running`` from the second ``get`` on (one step per
``get``), with a public IPv4 from ``addresses`` (cycled; by default distinct 127.0.1.x, so a
test can tell servers apart and still reach them on this machine). A deleted server is
``deleting`` for one more ``get``, then gone; the firewalls it was attached to keep it in their
``applied_to`` until then, so deleting such a firewall answers 422 ``resource_in_use``.

The catalogue is Hetzner's shape (``prices`` and ``locations`` per type, ``cx`` and ``cax`` types
in the EU locations only) and a create obeys it: a type a location does not offer answers 400
``invalid_input`` "unsupported location for server type", one not ``available`` there or a
location made full (``no_room``) 412 ``resource_unavailable``. ``withdraw`` and ``set_offer``
change what a location offers.

Faults are injected per call kind (``KINDS``) with the status, code, message, details and
headers to answer; ``power_off`` and ``vanish`` act on a server behind the provider's back.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.testing import cloud_http
from services.testing import hetzner_api as api
from services.testing.cloud_http import Fault, Reply, Request
from services.testing.hetzner_api import Answer

KINDS = (
    "server_create",
    "server_get",
    "server_list",
    "server_delete",
    "firewall_create",
    "firewall_get",
    "firewall_list",
    "firewall_delete",
    "firewall_set_rules",
    "action_get",
    "server_type_list",
    "server_type_get",
    "image_list",
    "image_get",
    "any",
)
RATE_LIMIT = 3600


@dataclass
class _Record:
    body: dict[str, Any]
    steps: deque[str] = field(default_factory=lambda: deque(["running"]))
    deleting: bool = False


class HetznerFake(cloud_http.FakeServer):
    """The fake server; use as a context manager (``with HetznerFake() as fake``); ``url`` is
    the base URL for ``endpointUrl`` (the client adds ``/v1``)."""

    thread_name = "hetzner-fake"

    def __init__(self, token: str = "fake-hcloud-token", *, addresses: Sequence[str] = ()) -> None:
        super().__init__(KINDS)
        self.token = token
        self.requests: list[tuple[str, str, str]] = []
        """(method, path with query, call kind) of every request, in order."""
        self.servers: dict[int, _Record] = {}
        self.firewalls: dict[int, dict[str, Any]] = {}
        self.created_total = 0
        self.create_bodies: list[dict[str, Any]] = []
        """Every server create request's JSON body, as sent (user data included)."""
        self._addresses: Iterator[str] = (
            itertools.cycle(list(addresses)) if addresses else api.loopback_addresses()
        )
        self._after: dict[str, deque[Callable[[], object]]] = {kind: deque() for kind in KINDS}
        self._remaining = RATE_LIMIT
        self._ids = itertools.count(40_000_001)
        self.server_types: dict[str, dict[str, Any]] = {
            n: api.server_type(n) for n in api.CATALOGUE
        }
        """The catalogue by type name, as ``GET /server_types`` shows it; tests may edit it."""
        self.images = [api.image(*record) for record in api.IMAGE_LIST]
        self.full: dict[str, str] = {}
        """Locations without room now, with the message their 412 says."""

    # ---------------------------------------------------------------- control

    def inject(
        self,
        status: int,
        code: str,
        *,
        kind: str = "any",
        times: int = 1,
        message: str = "",
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next ``times`` calls of ``kind`` with a Hetzner error."""
        text = message or f"injected {code} ({status})"
        fault = Fault(status, code, text, times, dict(headers or {}), dict(details or {}))
        self.add_fault(kind, fault)

    def after(self, kind: str, action: Callable[[], object]) -> None:
        """Run ``action`` once the next call of ``kind`` is answered: something happening
        between two calls of the provider (another process's create, a GC delete)."""
        self.check_kind(kind)
        with self._lock:
            self._after[kind].append(action)

    def calls(self, kind: str) -> int:
        with self._lock:
            return sum(1 for _, _, k in self.requests if k == kind)

    def power_off(self, server_id: int) -> None:
        """Someone powered the server off in the Cloud Console."""
        self.set_status(server_id, "off")

    def set_status(self, server_id: int, status: str) -> None:
        with self._lock:
            record = self.servers[server_id]
            record.body["status"] = status
            record.steps.clear()

    def vanish(self, server_id: int) -> None:
        """Delete behind the provider's back (a person in the console, another tool)."""
        with self._lock:
            self._remove(server_id)

    def no_room(self, location: str, message: str = "error during placement") -> None:
        """Every create in ``location`` answers 412 ``resource_unavailable`` with ``message``
        (Hetzner's words: "error during placement", "server location disabled")."""
        with self._lock:
            self.full[location] = message

    def room(self, location: str) -> None:
        with self._lock:
            self.full.pop(location, None)

    def withdraw(self, server_type: str, location: str) -> None:
        """``server_type`` is no longer offered in ``location``: gone from its ``locations``
        and ``prices``, as Hetzner shows a type a location never had."""
        with self._lock:
            record = self.server_types[server_type]
            record["locations"] = [e for e in record["locations"] if e["name"] != location]
            record["prices"] = [p for p in record["prices"] if p["location"] != location]

    def set_offer(
        self, server_type: str, location: str, *, available: bool = True, ends: str = ""
    ) -> None:
        """``server_type`` in ``location``: ``available`` now or not, and a deprecation whose
        ``unavailable_after`` is ``ends`` (an ISO time; "" none)."""
        with self._lock:
            record = self.server_types[server_type]
            entry = next(e for e in record["locations"] if e["name"] == location)
            entry["available"] = available
            entry["deprecation"] = (
                {"announced": "2025-01-01T00:00:00+00:00", "unavailable_after": ends}
                if ends
                else None
            )

    def put_server(self, name: str, labels: dict[str, str], status: str = "running") -> int:
        """A server made by someone else, for listing and name-clash tests."""
        with self._lock:
            _, answer, _ = self._create_server(
                {"name": name, "server_type": "cx23", "image": "debian-12", "labels": labels}
            )
            if answer is None or "server" not in answer:
                raise ValueError(f"the fake refused the server: {answer}")
            server_id = int(answer["server"]["id"])
            self.set_status(server_id, status)
            return server_id

    def put_firewall(self, name: str, labels: dict[str, str]) -> int:
        with self._lock:
            _, answer, _ = self._create_firewall({"name": name, "labels": labels})
            if answer is None or "firewall" not in answer:
                raise ValueError(f"the fake refused the firewall: {answer}")
            return int(answer["firewall"]["id"])

    def server_named(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((s.body for s in self.servers.values() if s.body["name"] == name), None)

    def firewall_named(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((f for f in self.firewalls.values() if f["name"] == name), None)

    # ---------------------------------------------------------------- dispatch

    def serve(self, request: Request) -> Reply:
        kind, args = api.route(request.method, request.path)
        status, answer, headers = self._answer(request, kind, args)
        with self._lock:
            actions = self._after.get(kind)
            if actions:
                actions.popleft()()
        return cloud_http.json_reply(
            status, answer, cloud_http.merge_headers(self.rate_headers(), headers)
        )

    def _answer(self, request: Request, kind: str, args: tuple[int, ...]) -> Answer:
        with self._lock:
            self.requests.append((request.method, request.target, kind))
            self._remaining = max(self._remaining - 1, 0)
        if request.header("Authorization") != f"Bearer {self.token}":
            return api.error(401, "unauthorized", "unable to authenticate")
        fault = self.fault_for(kind)
        if fault is not None:
            status, answer, _ = api.error(fault.status, fault.code, fault.message, fault.details)
            return status, answer, fault.headers
        body = cloud_http.parse_json(request.body)
        with self._lock:
            match kind:
                case "server_create":
                    self.create_bodies.append(body)
                    return self._create_server(body)
                case "server_get":
                    return self._get_server(args[0])
                case "server_list":
                    return api.page(
                        request.query, "servers", [s.body for s in self.servers.values()]
                    )
                case "server_delete":
                    return self._delete_server(args[0])
                case "firewall_create":
                    return self._create_firewall(body)
                case "firewall_get":
                    return self._get_firewall(args[0])
                case "firewall_list":
                    return api.page(request.query, "firewalls", list(self.firewalls.values()))
                case "firewall_delete":
                    return self._delete_firewall(args[0])
                case "firewall_set_rules":
                    return self._set_rules(args[0], body)
                case "action_get":
                    return 200, {"action": api.action(args[0], "create_server")}, {}
                case "server_type_list":
                    types = list(self.server_types.values())
                    return api.page(request.query, "server_types", types)
                case "server_type_get":
                    return self._by_id("server_type", list(self.server_types.values()), args[0])
                case "image_list":
                    found = api.images(request.query, self.images)
                    return api.page(request.query, "images", found)
                case "image_get":
                    return self._by_id("image", self.images, args[0])
            return api.error(404, "not_found", f"no fake route for {request.method} {request.path}")

    def rate_headers(self) -> dict[str, str]:
        with self._lock:
            reset = int(time.time()) + (RATE_LIMIT - self._remaining)
            return {
                "RateLimit-Limit": str(RATE_LIMIT),
                "RateLimit-Remaining": str(self._remaining),
                "RateLimit-Reset": str(reset),
            }

    def _by_id(self, key: str, records: list[dict[str, Any]], wanted: int) -> Answer:
        found = next((r for r in records if r["id"] == wanted), None)
        if found is None:
            return api.error(404, "not_found", f"{key} with ID '{wanted}' not found")
        return 200, {key: found}, {}

    # ---------------------------------------------------------------- servers

    def _create_server(self, body: dict[str, Any]) -> Answer:
        refused = api.server_problem(body, self.server_types, self.full)
        if refused is not None:
            return refused
        name = body["name"]
        if any(s.body["name"] == name for s in self.servers.values()):
            return api.error(
                409, "uniqueness_error", "server name is already used", api.fields("name", "unique")
            )
        firewall_ids = [int(f.get("firewall", 0)) for f in body.get("firewalls") or []]
        for firewall_id in firewall_ids:
            if firewall_id not in self.firewalls:
                return api.error(404, "not_found", f"firewall with ID '{firewall_id}' not found")
        server_id = next(self._ids)
        public = body.get("public_net") or {}
        location = body.get("location") or "fsn1"
        ipv4 = {"id": next(self._ids), "ip": next(self._addresses), "blocked": False}
        ipv6 = {"id": next(self._ids), "ip": f"2001:db8:{server_id % 65536:x}::/64"}
        image = str(body["image"])
        record = {
            "id": server_id,
            "name": name,
            "status": "initializing",
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "public_net": {
                "ipv4": {**ipv4, "dns_ptr": ""} if public.get("enable_ipv4", True) else None,
                "ipv6": {**ipv6, "blocked": False, "dns_ptr": []}
                if public.get("enable_ipv6", True)
                else None,
                "floating_ips": [],
                "firewalls": [{"id": f, "status": "applied"} for f in firewall_ids],
            },
            "private_net": [],
            "server_type": {"id": 1, "name": body["server_type"]},
            "location": {"id": 1, "name": location, "network_zone": api.LOCATIONS[location]},
            "image": {"id": 114690387, "name": image, "type": "system"},
            "labels": dict(body.get("labels") or {}),
            "protection": {"delete": False, "rebuild": False},
            "rescue_enabled": False,
            "locked": False,
            "volumes": [],
            "primary_disk_size": 40,
            "user_data": body.get("user_data"),
        }
        self.servers[server_id] = _Record(record)
        self.created_total += 1
        for firewall_id in firewall_ids:
            self.firewalls[firewall_id]["applied_to"].append(
                {"type": "server", "server": {"id": server_id}}
            )
        answer = {
            "server": api.public(record),
            "action": api.action(next(self._ids), "create_server"),
            "next_actions": [api.action(next(self._ids), "start_server")],
            "root_password": None,
        }
        return 201, answer, {}

    def _get_server(self, server_id: int) -> Answer:
        record = self.servers.get(server_id)
        if record is None:
            return api.error(404, "not_found", f"server with ID '{server_id}' not found")
        answer = {"server": api.public(record.body)}
        if record.deleting:
            self._remove(server_id)  # deleting once more, then gone
        elif record.steps:
            record.body["status"] = record.steps.popleft()
        return 200, answer, {}

    def _delete_server(self, server_id: int) -> Answer:
        record = self.servers.get(server_id)
        if record is None:
            return api.error(404, "not_found", f"server with ID '{server_id}' not found")
        if record.deleting:
            return api.error(423, "locked", "server is locked: an action is running")
        record.deleting = True
        record.steps.clear()
        record.body["status"] = "deleting"
        return 200, {"action": api.action(next(self._ids), "delete_server")}, {}

    def _remove(self, server_id: int) -> None:
        self.servers.pop(server_id, None)
        for firewall in self.firewalls.values():
            firewall["applied_to"] = [
                a for a in firewall["applied_to"] if a.get("server", {}).get("id") != server_id
            ]

    # ---------------------------------------------------------------- firewalls

    def _create_firewall(self, body: dict[str, Any]) -> Answer:
        name = body.get("name")
        if not isinstance(name, str) or not name:
            return api.invalid("name", "is required")
        if any(f["name"] == name for f in self.firewalls.values()):
            return api.error(
                409,
                "uniqueness_error",
                "firewall name is already used",
                api.fields("name", "unique"),
            )
        problem = api.labels_problem(body.get("labels")) or api.rules_problem(
            body.get("rules") or []
        )
        if problem:
            return api.invalid(*problem)
        firewall_id = next(self._ids)
        self.firewalls[firewall_id] = {
            "id": firewall_id,
            "name": name,
            "labels": dict(body.get("labels") or {}),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "rules": [api.rule(r) for r in body.get("rules") or []],
            "applied_to": [],
        }
        return 201, {"firewall": self.firewalls[firewall_id], "actions": []}, {}

    def _get_firewall(self, firewall_id: int) -> Answer:
        found = self.firewalls.get(firewall_id)
        if found is None:
            return api.error(404, "not_found", f"firewall with ID '{firewall_id}' not found")
        return 200, {"firewall": found}, {}

    def _delete_firewall(self, firewall_id: int) -> Answer:
        found = self.firewalls.get(firewall_id)
        if found is None:
            return api.error(404, "not_found", f"firewall with ID '{firewall_id}' not found")
        if found["applied_to"]:
            return api.error(422, "resource_in_use", "firewall is still applied to resources")
        del self.firewalls[firewall_id]
        return 204, None, {}

    def _set_rules(self, firewall_id: int, body: dict[str, Any]) -> Answer:
        found = self.firewalls.get(firewall_id)
        if found is None:
            return api.error(404, "not_found", f"firewall with ID '{firewall_id}' not found")
        problem = api.rules_problem(body.get("rules"))
        if problem:
            return api.invalid(*problem)
        found["rules"] = [api.rule(r) for r in body["rules"]]
        return 201, {"actions": [api.action(next(self._ids), "set_firewall_rules")]}, {}
