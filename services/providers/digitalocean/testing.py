"""A local HTTP fake of the DigitalOcean API endpoints the digitalocean provider calls.

The provider is tested through the real ``pydo`` async client (``endpointUrl`` pointing here), so
request encoding, paging and error decoding are the library's own, not a mock's. The fake follows
DigitalOcean's public API reference for the calls used:

- ``/v2/droplets``: POST (202, ``status: new``), GET list (``tag_name`` or ``name``, ``page`` /
  ``per_page`` up to 200, ``links.pages`` and ``meta.total``), GET by id, DELETE by id (204);
- ``/v2/firewalls``: POST (202), GET list, GET by id, PUT by id (the whole firewall), DELETE (204);
  a firewall may name only tags that exist, and must have a valid name and rules;
- ``/v2/tags``: POST (201, for an existing tag too);
- the Bearer token is checked on every call (401 ``Unauthorized`` otherwise); errors have
  DigitalOcean's shape, ``{"id": "...", "message": "..."}``, and every answer carries the
  ``ratelimit-*`` headers.

A droplet moves ``new`` -> ``active`` one step per GET of it, getting a public IPv4 address from
``addresses`` (by default distinct 127.0.1.x addresses; the e2e passes ``["127.0.0.1"]`` so a
local Squid stands in for every droplet). ``inject`` answers the next calls of a kind with an
error (status, DigitalOcean error id, message, headers); ``power_off``, ``destroy`` and
``archive`` act behind the provider's back; ``droplet_limit`` refuses creates as the account
limit does.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

KINDS = (
    "droplets.create",
    "droplets.list",
    "droplets.get",
    "droplets.delete",
    "firewalls.create",
    "firewalls.list",
    "firewalls.get",
    "firewalls.update",
    "firewalls.delete",
    "tags.create",
    "any",
)
REGIONS = frozenset({"ams3", "fra1", "lon1", "nyc1", "nyc3", "sfo3", "sgp1", "tor1", "syd1"})
SIZES = frozenset({"s-1vcpu-512mb-10gb", "s-1vcpu-1gb", "s-1vcpu-2gb", "s-2vcpu-4gb"})
IMAGES = frozenset({"debian-12-x64", "ubuntu-24-04-x64", "ubuntu-22-04-x64"})
DEFAULT_TOKEN = "dop_v1_fake_token_for_tests"
LIMIT_MESSAGE = "creating this/these droplet(s) will exceed your droplet limit"
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,253}[A-Za-z0-9])?\Z")
_TAG = re.compile(r"^[A-Za-z0-9:_-]{1,255}\Z")
_FIREWALL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,254}\Z")


@dataclass
class _Fault:
    status: int
    error_id: str
    message: str
    headers: dict[str, str]
    remaining: int


@dataclass
class Droplet:
    body: dict[str, Any]
    steps: deque[str] = field(default_factory=lambda: deque(["active"]))
    request: dict[str, Any] = field(default_factory=dict)
    """What the create sent (user data included), for tests."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DigitalOceanFake:
    """The fake server; use as a context manager (``with DigitalOceanFake() as fake``)."""

    def __init__(
        self, *, token: str = DEFAULT_TOKEN, addresses: Sequence[str] | None = None
    ) -> None:
        self.token = token
        self.droplets: dict[int, Droplet] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.tags: set[str] = set()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.calls: list[str] = []
        self.created_total = 0
        self.droplet_limit: int | None = None
        self._faults: dict[str, deque[_Fault]] = {kind: deque() for kind in KINDS}
        self._stalls: dict[str, float] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(3164444, 17)
        self._addresses: Iterator[str] = (
            itertools.cycle(list(addresses))
            if addresses
            else (f"127.0.{1 + n // 254}.{1 + n % 254}" for n in itertools.count())
        )
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- control

    @property
    def url(self) -> str:
        assert self._server is not None, "start the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> DigitalOceanFake:
        server = _Server(("127.0.0.1", 0), _handler(self))
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="do-fake")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> DigitalOceanFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def inject(
        self,
        kind: str,
        status: int,
        error_id: str,
        message: str = "",
        *,
        headers: dict[str, str] | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``kind`` with this DigitalOcean error."""
        if kind not in KINDS:
            raise ValueError(f"unknown call kind {kind!r}; use one of {', '.join(KINDS)}")
        text = message or f"injected {error_id} ({status})"
        with self._lock:
            self._faults[kind].append(_Fault(status, error_id, text, dict(headers or {}), times))

    def stall(self, kind: str, seconds: float) -> None:
        """Delay every answer to ``kind`` (a slow API, to trip the client's timeout)."""
        with self._lock:
            self._stalls[kind] = seconds

    def power_off(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "off"
            self.droplets[droplet_id].steps.clear()

    def archive(self, droplet_id: int) -> None:
        with self._lock:
            self.droplets[droplet_id].body["status"] = "archive"
            self.droplets[droplet_id].steps.clear()

    def destroy(self, droplet_id: int) -> None:
        """Destroy behind the provider's back (a person in the control panel)."""
        with self._lock:
            del self.droplets[droplet_id]

    def delete_firewall(self, firewall_id: str) -> None:
        with self._lock:
            del self.firewalls[firewall_id]

    def put(self, name: str, tags: list[str], status: str = "active") -> int:
        """A droplet made by someone else, for listing tests."""
        with self._lock:
            droplet_id = next(self._ids)
            body = self._droplet_body(droplet_id, {"name": name, "tags": tags}, status)
            self.droplets[droplet_id] = Droplet(body, deque())
            self.tags.update(tags)
            return droplet_id

    def calls_of(self, kind: str) -> int:
        with self._lock:
            return self.calls.count(kind)

    def by_name(self, name: str) -> list[Droplet]:
        with self._lock:
            return [d for d in self.droplets.values() if d.body["name"] == name]

    # ---------------------------------------------------------------- dispatch

    def handle(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        url = urlsplit(target)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        route = _route(method, url.path)
        with self._lock:
            self.requests.append((method, url.path, query))
            if route is not None:
                self.calls.append(route[0])
        if headers.get("authorization", "") != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unable to authenticate you")
        if route is None:
            return _error(404, "not_found", "The resource you were accessing could not be found.")
        kind, arg = route
        if self._stalls.get(kind):
            time.sleep(self._stalls[kind])
        with self._lock:
            fault = self._take_fault(kind)
            if fault is not None:
                status, answer, extra = _error(fault.status, fault.error_id, fault.message)
                return status, answer, {**extra, **fault.headers}
            payload = _json(body)
            match kind:
                case "droplets.create":
                    return self._create(payload)
                case "droplets.list":
                    return self._list_droplets(url.path, query)
                case "droplets.get":
                    return self._get(arg)
                case "droplets.delete":
                    return self._delete(arg)
                case "firewalls.create":
                    return self._firewall_create(payload)
                case "firewalls.list":
                    return self._page(url.path, query, "firewalls", list(self.firewalls.values()))
                case "firewalls.get":
                    found = self.firewalls.get(arg)
                    return (200, {"firewall": found}, {}) if found else _not_found()
                case "firewalls.update":
                    return self._firewall_update(arg, payload)
                case "firewalls.delete":
                    return (204, None, {}) if self.firewalls.pop(arg, None) else _not_found()
                case _:
                    return self._tag_create(payload)

    def _take_fault(self, kind: str) -> _Fault | None:
        for queue in (self._faults[kind], self._faults["any"]):
            if queue:
                fault = queue[0]
                fault.remaining -= 1
                if fault.remaining <= 0:
                    queue.popleft()
                return fault
        return None

    # ---------------------------------------------------------------- droplets

    def _create(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        name = payload.get("name")
        if not isinstance(name, str) or not _HOSTNAME.match(name):
            return _unprocessable(
                "Only valid hostname characters are allowed. (a-z, A-Z, 0-9, . and -)"
            )
        if payload.get("region") not in REGIONS:
            return _unprocessable("Region is not available")
        if payload.get("size") not in SIZES:
            return _unprocessable("You specified an invalid size for Droplet creation.")
        image = payload.get("image")
        if not (isinstance(image, int) and image > 0) and image not in IMAGES:
            return _unprocessable(f"Image {image!r} not found: you specified an invalid image")
        tags = payload.get("tags") or []
        if not isinstance(tags, list) or not all(
            isinstance(t, str) and _TAG.match(t) for t in tags
        ):
            return _unprocessable("tags: invalid tag name (letters, numbers, ':', '-' and '_')")
        if len(str(payload.get("user_data") or "").encode()) > 64 * 1024:
            return _unprocessable("user_data: the user data is too large (64 KiB at most)")
        if self.droplet_limit is not None and len(self.droplets) >= self.droplet_limit:
            return _unprocessable(LIMIT_MESSAGE)
        droplet_id = next(self._ids)
        body = self._droplet_body(droplet_id, payload, "new")
        self.droplets[droplet_id] = Droplet(body, request=dict(payload))
        self.tags.update(tags)
        self.created_total += 1
        links = {"actions": [{"id": droplet_id + 1, "rel": "create", "href": ""}]}
        return 202, {"droplet": _copy(body), "links": links}, {}

    def _droplet_body(
        self, droplet_id: int, payload: dict[str, Any], status: str
    ) -> dict[str, Any]:
        size = str(payload.get("size") or "s-1vcpu-512mb-10gb")
        region = str(payload.get("region") or "ams3")
        return {
            "id": droplet_id,
            "name": payload["name"],
            "memory": 512,
            "vcpus": 1,
            "disk": 10,
            "locked": False,
            "status": status,
            "created_at": _now(),
            "features": ["ipv6"] if payload.get("ipv6") else [],
            "image": {"slug": payload.get("image"), "distribution": "Debian"},
            "size_slug": size,
            "size": {"slug": size},
            "networks": {"v4": [], "v6": []},
            "region": {"slug": region, "name": region.upper(), "available": True},
            "tags": list(payload.get("tags") or []),
            "vpc_uuid": payload.get("vpc_uuid") or str(uuid.UUID(int=droplet_id)),
        }

    def _get(self, arg: str) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        record = self.droplets.get(int(arg)) if arg.isdigit() else None
        if record is None:
            return _not_found()
        answer = _copy(record.body)
        if record.steps:
            record.body["status"] = record.steps.popleft()
            if record.body["status"] == "active":
                address = next(self._addresses)
                record.body["networks"]["v4"] = [
                    {"ip_address": "10.110.0.2", "netmask": "255.255.240.0", "type": "private"},
                    {"ip_address": address, "netmask": "255.255.240.0", "type": "public"},
                ]
        return 200, {"droplet": answer}, {}

    def _delete(self, arg: str) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        if not arg.isdigit() or self.droplets.pop(int(arg), None) is None:
            return _not_found()
        return 204, None, {}

    def _list_droplets(
        self, path: str, query: dict[str, str]
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        tag, name = query.get("tag_name"), query.get("name")
        if tag and name:
            return _error(400, "bad_request", "tag_name can not be combined with name")
        items = [d.body for d in sorted(self.droplets.values(), key=lambda d: d.body["id"])]
        if tag:
            items = [b for b in items if tag in b["tags"]]
        if name:
            items = [b for b in items if b["name"].lower() == name.lower()]
        return self._page(path, query, "droplets", items)

    def _page(
        self, path: str, query: dict[str, str], key: str, items: list[dict[str, Any]]
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        try:
            page = max(1, int(query.get("page", "1")))
            per_page = min(200, max(1, int(query.get("per_page", "20"))))
        except ValueError:
            return _error(400, "bad_request", "page and per_page must be numbers")
        last = max(1, -(-len(items) // per_page))
        start = (page - 1) * per_page
        pages: dict[str, str] = {}

        def link(number: int) -> str:
            return f"{self.url}{path}?{urlencode({**query, 'page': number, 'per_page': per_page})}"

        if page < last:
            pages.update(next=link(page + 1), last=link(last))
        if page > 1:
            pages.update(first=link(1), prev=link(page - 1))
        answer = {
            key: [_copy(i) for i in items[start : start + per_page]],
            "links": {"pages": pages} if pages else {},
            "meta": {"total": len(items)},
        }
        return 200, answer, {}

    # ---------------------------------------------------------------- firewalls and tags

    def _firewall_problem(self, payload: dict[str, Any]) -> str:
        name = payload.get("name")
        if not isinstance(name, str) or not _FIREWALL_NAME.match(name):
            return "name: must start with a letter or digit and hold letters, digits, '.', '-'"
        for key, side in (("inbound_rules", "sources"), ("outbound_rules", "destinations")):
            for rule in payload.get(key) or []:
                if rule.get("protocol") not in ("tcp", "udp", "icmp"):
                    return f"{key}: protocol must be tcp, udp or icmp"
                if rule["protocol"] != "icmp" and not rule.get("ports"):
                    return f"{key}: ports is required for {rule['protocol']}"
                if not (rule.get(side) or {}).get("addresses"):
                    return f"{key}: {side} must not be empty"
        missing = [t for t in payload.get("tags") or [] if t not in self.tags]
        if missing:
            return f"tags: tag {missing[0]!r} does not exist"
        return ""

    def _firewall_create(
        self, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        problem = self._firewall_problem(payload)
        if problem:
            return _unprocessable(problem)
        firewall_id = str(uuid.uuid4())
        firewall = self._firewall_body(firewall_id, payload, _now())
        self.firewalls[firewall_id] = firewall
        return 202, {"firewall": _copy(firewall)}, {}

    def _firewall_update(
        self, firewall_id: str, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        existing = self.firewalls.get(firewall_id)
        if existing is None:
            return _not_found()
        problem = self._firewall_problem(payload)
        if problem:
            return _unprocessable(problem)
        firewall = self._firewall_body(firewall_id, payload, existing["created_at"])
        self.firewalls[firewall_id] = firewall
        return 200, {"firewall": _copy(firewall)}, {}

    @staticmethod
    def _firewall_body(firewall_id: str, payload: dict[str, Any], created: str) -> dict[str, Any]:
        return {
            "id": firewall_id,
            "name": payload["name"],
            "status": "succeeded",
            "inbound_rules": list(payload.get("inbound_rules") or []),
            "outbound_rules": list(payload.get("outbound_rules") or []),
            "created_at": created,
            "droplet_ids": list(payload.get("droplet_ids") or []),
            "tags": list(payload.get("tags") or []),
            "pending_changes": [],
        }

    def _tag_create(
        self, payload: dict[str, Any]
    ) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
        name = payload.get("name")
        if not isinstance(name, str) or not _TAG.match(name):
            return _unprocessable("name: tags may contain letters, numbers, colons, dashes, ...")
        self.tags.add(name)
        resources = {"count": 0, "droplets": {"count": 0}}
        return 201, {"tag": {"name": name, "resources": resources}}, {}


def _route(method: str, path: str) -> tuple[str, str] | None:
    parts = path.rstrip("/").split("/")[1:]
    match (method, parts):
        case ("POST", ["v2", "droplets"]):
            return "droplets.create", ""
        case ("GET", ["v2", "droplets"]):
            return "droplets.list", ""
        case ("GET", ["v2", "droplets", droplet_id]):
            return "droplets.get", droplet_id
        case ("DELETE", ["v2", "droplets", droplet_id]):
            return "droplets.delete", droplet_id
        case ("POST", ["v2", "firewalls"]):
            return "firewalls.create", ""
        case ("GET", ["v2", "firewalls"]):
            return "firewalls.list", ""
        case ("GET", ["v2", "firewalls", firewall_id]):
            return "firewalls.get", firewall_id
        case ("PUT", ["v2", "firewalls", firewall_id]):
            return "firewalls.update", firewall_id
        case ("DELETE", ["v2", "firewalls", firewall_id]):
            return "firewalls.delete", firewall_id
        case ("POST", ["v2", "tags"]):
            return "tags.create", ""
    return None


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def _json(body: bytes) -> dict[str, Any]:
    try:
        decoded = json.loads(body or b"{}")
    except ValueError:
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _error(
    status: int, error_id: str, message: str
) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    return status, {"id": error_id, "message": message}, {}


def _not_found() -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    return _error(404, "not_found", "The resource you were accessing could not be found.")


def _unprocessable(message: str) -> tuple[int, dict[str, Any] | None, dict[str, str]]:
    return _error(422, "unprocessable_entity", message)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up (a timeout test) is expected; anything else is printed."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


def _handler(fake: DigitalOceanFake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, answer, extra = fake.handle(self.command, self.path, headers, body)
            data = json.dumps(answer).encode() if answer is not None else b""
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("ratelimit-limit", "5000")
            self.send_header("ratelimit-remaining", "4999")
            if "ratelimit-reset" not in {k.lower() for k in extra}:
                self.send_header("ratelimit-reset", str(int(time.time()) + 60))
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data:
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: ``fake.requests`` records what was asked."""

    return Handler
