"""The DigitalOcean account the fake in ``digitalocean.py`` serves: droplets, firewalls and tags,
the size catalogue, images and the account, answered as DigitalOcean's public API reference
describes them for the calls the provider makes (the catalogue's contents:
``digitalocean_catalogue``). No network here: ``digitalocean.py`` routes HTTP requests to
``FakeAccount.answer``. Paths are percent-decoded segment by segment, as a real server does, so
a tag sent as ``egress-proxies-provider%3Aname`` is the tag ``egress-proxies-provider:name``.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlencode

from services.testing import digitalocean_catalogue
from services.testing.digitalocean_catalogue import IMAGES

REGIONS = frozenset(digitalocean_catalogue.REGIONS)
ACCOUNT_LIMIT = 25
"""The droplet limit ``/v2/account`` answers while ``droplet_limit`` is unset (not enforced)."""
LIMIT_MESSAGE = "creating this/these droplet(s) will exceed your droplet limit"
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,253}[A-Za-z0-9])?\Z")
_TAG = re.compile(r"^[A-Za-z0-9:_-]{1,255}\Z")
_FIREWALL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,254}\Z")

Answer = tuple[int, dict[str, Any] | None, dict[str, str]]
"""Status, JSON body (None: no body), extra headers."""


@dataclass
class Droplet:
    body: dict[str, Any]
    steps: deque[str] = field(default_factory=lambda: deque(["active"]))
    request: dict[str, Any] = field(default_factory=dict)
    """What the create sent (user data included), for tests."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeAccount:
    """The account's state; every method is called under the fake's lock."""

    def __init__(self, addresses: Sequence[str] | None = None) -> None:
        self.droplets: dict[int, Droplet] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.tags: set[str] = set()
        self.created_total = 0
        self.droplet_limit: int | None = None
        self.account_status = "active"
        self._ids = itertools.count(3164444, 17)
        self._addresses: Iterator[str] = (
            itertools.cycle(list(addresses))
            if addresses
            else (f"127.0.{1 + n // 254}.{1 + n % 254}" for n in itertools.count())
        )

    def answer(
        self,
        kind: str,
        arg: str,
        *,
        base: str,
        path: str,
        query: dict[str, str],
        payload: dict[str, Any],
    ) -> Answer:
        """The answer to one call of ``kind`` (see ``route``); ``base`` is the server's URL, for
        the paging links."""
        match kind:
            case "droplets.create":
                return self._create(payload)
            case "droplets.list":
                return self._list_droplets(base, path, query)
            case "droplets.get":
                return self._get(arg)
            case "droplets.delete":
                return self._delete(arg)
            case "firewalls.create":
                return self._firewall_create(payload)
            case "firewalls.list":
                return self._page(base, path, query, "firewalls", list(self.firewalls.values()))
            case "firewalls.get":
                found = self.firewalls.get(arg)
                return (200, {"firewall": found}, {}) if found else not_found()
            case "firewalls.update":
                return self._firewall_update(arg, payload)
            case "firewalls.delete":
                return (204, None, {}) if self.firewalls.pop(arg, None) else not_found()
            case "sizes.list":
                sizes = [
                    digitalocean_catalogue.size_body(o) for o in digitalocean_catalogue.SIZE_OFFERS
                ]
                return self._page(base, path, query, "sizes", sizes)
            case "images.get":
                image = digitalocean_catalogue.image_body(arg)
                return (200, {"image": image}, {}) if image else not_found()
            case "account.get":
                limit = ACCOUNT_LIMIT if self.droplet_limit is None else self.droplet_limit
                return 200, digitalocean_catalogue.account_body(limit, self.account_status), {}
            case "tags.get":
                resources = {"count": 0, "droplets": {"count": 0}}
                known = arg in self.tags
                return (
                    (200, {"tag": {"name": arg, "resources": resources}}, {})
                    if known
                    else not_found()
                )
            case _:
                return self._tag_create(payload)

    # ---------------------------------------------------------------- droplets

    def _create(self, payload: dict[str, Any]) -> Answer:
        name = payload.get("name")
        if not isinstance(name, str) or not _HOSTNAME.match(name):
            return unprocessable(
                "Only valid hostname characters are allowed. (a-z, A-Z, 0-9, . and -)"
            )
        if payload.get("region") not in REGIONS:
            return unprocessable("Region is not available")
        refusal = digitalocean_catalogue.size_refusal(payload.get("size"), payload.get("region"))
        if refusal:
            return unprocessable(refusal)
        image = payload.get("image")
        if not (isinstance(image, int) and image > 0) and image not in IMAGES:
            return unprocessable(f"Image {image!r} not found: you specified an invalid image")
        tags = payload.get("tags") or []
        if not isinstance(tags, list) or not all(
            isinstance(t, str) and _TAG.match(t) for t in tags
        ):
            return unprocessable("tags: invalid tag name (letters, numbers, ':', '-' and '_')")
        if len(str(payload.get("user_data") or "").encode()) > 64 * 1024:
            return unprocessable("user_data: the user data is too large (64 KiB at most)")
        if self.droplet_limit is not None and len(self.droplets) >= self.droplet_limit:
            return unprocessable(LIMIT_MESSAGE)
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
        size = str(payload.get("size") or "s-1vcpu-1gb")
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

    def _get(self, arg: str) -> Answer:
        record = self.droplets.get(int(arg)) if arg.isdigit() else None
        if record is None:
            return not_found()
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

    def _delete(self, arg: str) -> Answer:
        if not arg.isdigit() or self.droplets.pop(int(arg), None) is None:
            return not_found()
        return 204, None, {}

    def _list_droplets(self, base: str, path: str, query: dict[str, str]) -> Answer:
        tag, name = query.get("tag_name"), query.get("name")
        if tag and name:
            return error(400, "bad_request", "tag_name can not be combined with name")
        items = [d.body for d in sorted(self.droplets.values(), key=lambda d: d.body["id"])]
        if tag:
            # A tag nobody made yet lists nothing, 200: the reference documents no 404 here
            # (it does for the delete by tag), and the tag's absence is no error to a listing.
            items = [b for b in items if tag in self.tags and tag in b["tags"]]
        if name:
            items = [b for b in items if b["name"].lower() == name.lower()]
        return self._page(base, path, query, "droplets", items)

    def _page(
        self, base: str, path: str, query: dict[str, str], key: str, items: list[dict[str, Any]]
    ) -> Answer:
        try:
            page = max(1, int(query.get("page", "1")))
            per_page = min(200, max(1, int(query.get("per_page", "20"))))
        except ValueError:
            return error(400, "bad_request", "page and per_page must be numbers")
        last = max(1, -(-len(items) // per_page))
        start = (page - 1) * per_page
        pages: dict[str, str] = {}

        def link(number: int) -> str:
            return f"{base}{path}?{urlencode({**query, 'page': number, 'per_page': per_page})}"

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
                if not isinstance(rule.get("ports"), str) or not rule["ports"]:
                    # Required for every protocol by the reference, icmp included ("0").
                    return f"{key}: ports is required"
                if not (rule.get(side) or {}).get("addresses"):
                    return f"{key}: {side} must not be empty"
        missing = [t for t in payload.get("tags") or [] if t not in self.tags]
        if missing:
            return f"tags: tag {missing[0]!r} does not exist"
        return ""

    def _firewall_create(self, payload: dict[str, Any]) -> Answer:
        problem = self._firewall_problem(payload)
        if problem:
            return unprocessable(problem)
        firewall_id = str(uuid.uuid4())
        firewall = self._firewall_body(firewall_id, payload, _now())
        self.firewalls[firewall_id] = firewall
        return 202, {"firewall": _copy(firewall)}, {}

    def _firewall_update(self, firewall_id: str, payload: dict[str, Any]) -> Answer:
        existing = self.firewalls.get(firewall_id)
        if existing is None:
            return not_found()
        problem = self._firewall_problem(payload)
        if problem:
            return unprocessable(problem)
        firewall = self._firewall_body(firewall_id, payload, existing["created_at"])
        self.firewalls[firewall_id] = firewall
        return 200, {"firewall": _copy(firewall)}, {}

    @staticmethod
    def _firewall_body(firewall_id: str, payload: dict[str, Any], created: str) -> dict[str, Any]:
        return {
            "id": firewall_id,
            "name": payload["name"],
            "status": "succeeded",
            "inbound_rules": _as_answered(payload.get("inbound_rules")),
            "outbound_rules": _as_answered(payload.get("outbound_rules")),
            "created_at": created,
            "droplet_ids": list(payload.get("droplet_ids") or []),
            "tags": list(payload.get("tags") or []),
            "pending_changes": [],
        }

    def _tag_create(self, payload: dict[str, Any]) -> Answer:
        name = payload.get("name")
        if not isinstance(name, str) or not _TAG.match(name):
            return unprocessable("name: tags may contain letters, numbers, colons, dashes, ...")
        self.tags.add(name)
        resources = {"count": 0, "droplets": {"count": 0}}
        return 201, {"tag": {"name": name, "resources": resources}}, {}


def _as_answered(rules: object) -> list[dict[str, Any]]:
    """Rules as the API answers them: an icmp rule's ports always read "0"."""
    answered = [dict(r) for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []
    for rule in answered:
        if rule.get("protocol") == "icmp":
            rule["ports"] = "0"
    return answered


def route(method: str, path: str) -> tuple[str, str] | None:
    parts = [unquote(part) for part in path.rstrip("/").split("/")[1:]]
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
        case ("GET", ["v2", "tags", tag]):
            return "tags.get", tag
        case ("GET", ["v2", "sizes"]):
            return "sizes.list", ""
        case ("GET", ["v2", "images", image]):
            return "images.get", image
        case ("GET", ["v2", "account"]):
            return "account.get", ""
    return None


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def error(status: int, error_id: str, message: str) -> Answer:
    return status, {"id": error_id, "message": message}, {}


def not_found() -> Answer:
    return error(404, "not_found", "The resource you were accessing could not be found.")


def unprocessable(message: str) -> Answer:
    return error(422, "unprocessable_entity", message)
