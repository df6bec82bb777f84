"""What the Hetzner Cloud API fake (``hetzner.py``) answers with: routes, request checks, the
JSON shapes of servers, firewalls, actions, pages and errors, as Hetzner's public API reference
gives them for the calls the provider makes. Split from the server so each file stays readable;
only ``hetzner.py`` uses it (the HTTP plumbing is ``services.testing.cloud_http``)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from services.providers.hetzner.pure.mapping import LABEL_KEY, LABEL_VALUE, SERVER_NAME

LOCATIONS = {
    "fsn1": "eu-central",
    "nbg1": "eu-central",
    "hel1": "eu-central",
    "ash": "us-east",
    "hil": "us-west",
    "sin": "ap-southeast",
}
EU = ("fsn1", "nbg1", "hel1")
EVERYWHERE = tuple(LOCATIONS)
# name: (id, architecture, cpu type, cores, memory GB, disk GB, net monthly EUR, locations).
# ``cx`` and ``cax`` types are offered in the EU locations only, as on Hetzner.
CATALOGUE: dict[str, tuple[int, str, str, int, float, int, str, tuple[str, ...]]] = {
    "cx23": (104, "x86", "shared", 2, 4.0, 40, "3.4900", EU),
    "cx33": (105, "x86", "shared", 4, 8.0, 80, "5.4900", EU),
    "cx43": (106, "x86", "shared", 8, 16.0, 160, "9.4900", EU),
    "cx53": (107, "x86", "shared", 16, 32.0, 320, "17.4900", EU),
    "cax11": (45, "arm", "shared", 2, 4.0, 40, "3.7900", EU),
    "cpx12": (108, "x86", "shared", 1, 2.0, 40, "4.9900", EVERYWHERE),
    "cpx22": (109, "x86", "shared", 2, 4.0, 80, "7.9900", EVERYWHERE),
    "ccx13": (96, "x86", "dedicated", 2, 8.0, 80, "12.4900", EVERYWHERE),
}
# (id, name, architecture, os flavor, os version)
IMAGE_LIST = (
    (114690387, "debian-12", "x86", "debian", "12"),
    (114690389, "debian-12", "arm", "debian", "12"),
    (226354002, "debian-13", "x86", "debian", "13"),
    (103908070, "ubuntu-22.04", "x86", "ubuntu", "22.04"),
    (161547269, "ubuntu-24.04", "x86", "ubuntu", "24.04"),
    (161547270, "ubuntu-24.04", "arm", "ubuntu", "24.04"),
    (76766499, "rocky-9", "x86", "rocky", "9"),
)
IMAGES = frozenset({name for _, name, *_ in IMAGE_LIST} | {str(i) for i, *_ in IMAGE_LIST})
SELECTOR = re.compile(r"^(!?)([^=!]+?)(?:(==|=|!=)(.*))?\Z")
Answer = tuple[int, dict[str, Any] | None, dict[str, str]]


Term = tuple[bool, str, str, str]
"""(negated, key, operator or "", value) of one label selector term."""


def terms(selector: str) -> list[Term] | str:
    """The selector's terms, or the first term that is not one."""
    found: list[Term] = []
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        match = SELECTOR.match(term)
        if match is None:
            return term
        negated, key, op, value = match.groups()
        found.append((bool(negated), key.strip(), op or "", value or ""))
    return found


def selected(labels: dict[str, str], terms: list[Term]) -> bool:
    for negated, key, op, value in terms:
        if not op:
            if (key in labels) == negated:
                return False
        elif (labels.get(key) == value) != (op in ("=", "==")):
            return False
    return True


def server_type(name: str) -> dict[str, Any]:
    """A server type as ``GET /server_types`` shows it: ``prices`` for each location it is
    offered in, and ``locations`` with Hetzner's per-location ``available`` and
    ``deprecation``."""
    type_id, arch, cpu, cores, memory, disk, monthly, where = CATALOGUE[name]
    hourly = f"{float(monthly) / 730:.4f}"

    def price(net: str) -> dict[str, str]:
        return {"net": net, "gross": f"{float(net) * 1.19:.4f}"}

    return {
        "id": type_id,
        "name": name,
        "description": name.upper(),
        "category": "cost_optimized" if cpu == "shared" else "dedicated",
        "cores": cores,
        "memory": memory,
        "disk": disk,
        "deprecated": False,
        "deprecation": None,
        "prices": [
            {
                "location": location,
                "price_hourly": price(hourly),
                "price_monthly": price(monthly),
                "included_traffic": 21990232555520 if location in EU else 1099511627776,
                "price_per_tb_traffic": price("1.0000"),
            }
            for location in where
        ],
        "storage_type": "local",
        "cpu_type": cpu,
        "architecture": arch,
        "locations": [
            {
                "id": EVERYWHERE.index(location) + 1,
                "name": location,
                "deprecation": None,
                "available": True,
                "recommended": location in EU,
            }
            for location in where
        ],
    }


def image(image_id: int, name: str, arch: str, flavor: str, version: str) -> dict[str, Any]:
    return {
        "id": image_id,
        "type": "system",
        "status": "available",
        "name": name,
        "description": f"{flavor.capitalize()} {version}",
        "image_size": None,
        "disk_size": 5,
        "created": "2024-06-01T00:00:00+00:00",
        "created_from": None,
        "bound_to": None,
        "os_flavor": flavor,
        "os_version": version,
        "rapid_deploy": True,
        "protection": {"delete": False},
        "deprecated": None,
        "deleted": None,
        "labels": {},
        "architecture": arch,
    }


def server_problem(
    body: dict[str, Any], types: dict[str, dict[str, Any]], full: dict[str, str]
) -> Answer | None:
    """What Hetzner answers a create that cannot be made, or None. ``types``: the catalogue
    (``server_type`` records by name); ``full``: locations without room now, with the message
    their ``resource_unavailable`` says."""
    name = body.get("name")
    if not isinstance(name, str) or not SERVER_NAME.match(name):
        return invalid("name", "must be a valid hostname")
    offered = types.get(str(body.get("server_type")))
    if offered is None:
        return invalid("server_type", f"server type {body.get('server_type')!r} not found")
    if str(body.get("image")) not in IMAGES:
        return invalid("image", f"image {body.get('image')!r} not found")
    location = body.get("location", "fsn1")
    if location not in LOCATIONS:
        return invalid("location", f"location {location!r} not found")
    user_data = body.get("user_data") or ""
    if len(str(user_data).encode()) > 32 * 1024:
        return invalid("user_data", "is limited to 32 KiB")
    problem = labels_problem(body.get("labels"))
    if problem:
        return invalid(*problem)
    entry = next((e for e in offered["locations"] if e["name"] == location), None)
    now = datetime.now(UTC).isoformat()
    ended = entry is not None and (entry["deprecation"] or {}).get("unavailable_after", now) < now
    if entry is None or ended:
        # Hetzner's words, without field details (its answer carries none).
        return error(400, "invalid_input", "unsupported location for server type")
    if location in full:
        return error(412, "resource_unavailable", full[location])
    if not entry["available"]:
        return error(412, "resource_unavailable", "error during placement")
    return None


def labels_problem(labels: object) -> tuple[str, str] | None:
    if labels is None:
        return None
    if not isinstance(labels, dict):
        return "labels", "must be an object"
    for key, value in labels.items():
        if not LABEL_KEY.match(str(key)) or not LABEL_VALUE.match(str(value)):
            return "labels", f"invalid label {key}={value!r}"
    return None


def rules_problem(rules: object) -> tuple[str, str] | None:
    if not isinstance(rules, list):
        return "rules", "must be a list"
    for rule in rules:
        if not isinstance(rule, dict) or rule.get("direction") not in ("in", "out"):
            return "rules", "direction must be in or out"
        if rule.get("protocol") not in ("tcp", "udp", "icmp", "esp", "gre"):
            return "rules", "unknown protocol"
        if rule.get("protocol") in ("tcp", "udp") and not rule.get("port"):
            return "rules", "port is required for tcp and udp"
        sources = rule.get("source_ips") or []
        if rule["direction"] == "in" and not 1 <= len(sources) <= 100:
            return "rules", "an inbound rule needs 1-100 source_ips"
    return None


def rule(rule: dict[str, Any]) -> dict[str, Any]:
    return {
        "direction": rule["direction"],
        "protocol": rule["protocol"],
        "port": rule.get("port"),
        "source_ips": list(rule.get("source_ips") or []),
        "destination_ips": list(rule.get("destination_ips") or []),
        "description": rule.get("description"),
    }


def public(record: dict[str, Any]) -> dict[str, Any]:
    """What the API shows of a server (user data is write-only)."""
    answer: dict[str, Any] = json.loads(json.dumps(record))
    answer.pop("user_data", None)
    return answer


def action(action_id: int, command: str) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat(timespec="seconds")
    return {
        "id": action_id,
        "command": command,
        "status": "running",
        "progress": 0,
        "started": now,
        "finished": None,
        "resources": [],
        "error": None,
    }


def loopback_addresses() -> Iterator[str]:
    """127.0.1.1, 127.0.1.2, ...: distinct, on this machine, never a network or broadcast."""
    for number in itertools.count(257):
        if number % 256 not in (0, 255):
            yield f"127.{number // 65536 % 256}.{number // 256 % 256}.{number % 256}"


def fields(name: str, message: str) -> dict[str, Any]:
    return {"fields": [{"name": name, "messages": [message]}]}


def invalid(name: str, message: str) -> Answer:
    return error(400, "invalid_input", f"invalid input in field '{name}'", fields(name, message))


def error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> Answer:
    return status, {"error": {"code": code, "message": message, "details": details or {}}}, {}


def route(method: str, path: str) -> tuple[str, tuple[int, ...]]:
    parts = path.rstrip("/").split("/")
    if len(parts) < 3 or parts[1] != "v1":
        return "unknown", ()
    rest = parts[2:]
    ident = int(rest[1]) if len(rest) > 1 and rest[1].isdigit() else 0
    match (method, rest):
        case ("POST", ["servers"]):
            return "server_create", ()
        case ("GET", ["servers"]):
            return "server_list", ()
        case ("GET", ["servers", _]) if ident:
            return "server_get", (ident,)
        case ("DELETE", ["servers", _]) if ident:
            return "server_delete", (ident,)
        case ("POST", ["firewalls"]):
            return "firewall_create", ()
        case ("GET", ["firewalls"]):
            return "firewall_list", ()
        case ("GET", ["firewalls", _]) if ident:
            return "firewall_get", (ident,)
        case ("DELETE", ["firewalls", _]) if ident:
            return "firewall_delete", (ident,)
        case ("POST", ["firewalls", _, "actions", "set_rules"]) if ident:
            return "firewall_set_rules", (ident,)
        case ("GET", ["actions", _]) if ident:
            return "action_get", (ident,)
        case ("GET", ["server_types"]):
            return "server_type_list", ()
        case ("GET", ["server_types", _]) if ident:
            return "server_type_get", (ident,)
        case ("GET", ["images"]):
            return "image_list", ()
        case ("GET", ["images", _]) if ident:
            return "image_get", (ident,)
    return "unknown", ()


def page(query: dict[str, list[str]], key: str, items: list[dict[str, Any]]) -> Answer:
    """One page of ``items`` that match the query's ``name`` and ``label_selector``, with
    Hetzner's ``meta.pagination``."""
    wanted = terms(",".join(query.get("label_selector", [])))
    if isinstance(wanted, str):
        return invalid("label_selector", f"cannot parse {wanted!r}")
    names = query.get("name")
    found = [
        public(item) if key == "servers" else item
        for item in sorted(items, key=lambda i: int(i["id"]))
        if (not names or item["name"] == names[-1]) and selected(item.get("labels", {}), wanted)
    ]
    try:
        number = max(int(query.get("page", ["1"])[-1]), 1)
        per_page = min(max(int(query.get("per_page", ["25"])[-1]), 1), 50)
    except ValueError:
        return invalid("page", "must be a positive integer")
    last = max((len(found) + per_page - 1) // per_page, 1)
    pagination = {
        "page": number,
        "per_page": per_page,
        "previous_page": number - 1 if number > 1 else None,
        "next_page": number + 1 if number < last else None,
        "last_page": last,
        "total_entries": len(found),
    }
    chunk = found[(number - 1) * per_page : number * per_page]
    return 200, {key: chunk, "meta": {"pagination": pagination}}, {}


def images(query: dict[str, list[str]], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The images ``GET /images`` keeps for its ``architecture``, ``type`` and
    ``include_deprecated`` filters (``name`` and paging are ``page``'s)."""
    arches = query.get("architecture")
    types = query.get("type")
    deprecated = query.get("include_deprecated", ["false"])[-1] == "true"
    return [
        r
        for r in records
        if (not arches or r["architecture"] in arches)
        and (not types or r["type"] in types)
        and (deprecated or r["deprecated"] is None)
    ]
