"""Verified egress through `up` with real Squids, each provider leaving from its own loopback
address, and an echo server that answers each of those as a public test address the MaxMind
files of the test place: one German, one American, one shared by two proxies
(docs/decisions/0111-verified-egress.md).

A `country: de` proxy leaving from America is not leased and the refusal says what was seen;
with `onMismatch: replace` it is replaced, a bounded number of times; the shared address is
flagged and, under `--unique-egress`, the later proxy is not leased; an address that changes
under a lease is recorded as a change and the lease moves to a fresh instance (make-before-break)
without its holder losing it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.echo import echo_server
from tests.support.mmdb import write_asn_db, write_country_db
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GERMAN, AMERICAN, SHARED, MOVED = "203.0.113.5", "198.51.100.7", "192.0.2.9", "198.51.100.8"

PROVIDERS = """\
providers:
  - {{name: p-de, type: local, local: {{dataDir: "{d}/de", outgoingAddress: 127.0.0.2}}}}
  - {{name: p-us, type: local, local: {{dataDir: "{d}/us", outgoingAddress: 127.0.0.3}}}}
  - {{name: p-nat, type: local, local: {{dataDir: "{d}/nat", outgoingAddress: 127.0.0.4}}}}
"""


def proxy(name: str, provider: str, *, on_mismatch: str = "keep", expect: str = "de") -> str:
    egress = (
        f"egress: {{expect: {{country: {expect}}}, onMismatch: {on_mismatch}}}" if expect else ""
    )
    return f"""\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: {name}, namespace: crawl}}
spec:
  provider: {provider}
  attributes: {{country: de, role: {name}}}
  healthCheck: {{intervalSeconds: 1}}
  {egress}
---
"""


async def views(up: Up) -> dict[str, dict[str, Any]]:
    status, body = await up.api_call("GET", "/v1/proxies")
    assert status == 200, body
    return {p["name"]: p for p in body["items"]}


async def proxy_events(up: Up) -> list[dict[str, Any]]:
    got = await up.cli("events", "--stream", "PROXY", "-o", "json")
    assert got.returncode == 0, got.stdout + got.stderr
    return [json.loads(line) for line in got.stdout.splitlines() if line.strip()]


async def test_egress_is_verified_judged_and_acted_on(tmp_path: Path) -> None:
    providers = tmp_path / "providers.yaml"
    providers.write_text(PROVIDERS.format(d=tmp_path / "instances"))
    country = write_country_db(
        tmp_path / "country.mmdb",
        {"203.0.113.0/24": "DE", "198.51.100.0/24": "US", "192.0.2.0/24": "US"},
    )
    asn = write_asn_db(
        tmp_path / "asn.mmdb",
        {
            "203.0.113.0/24": (3320, "Deutsche Telekom AG"),
            "198.51.100.0/24": (7018, "AT&T Services, Inc."),
            "192.0.2.0/24": (64500, "Shared NAT"),
        },
    )
    manifest = tmp_path / "proxies.yaml"
    manifest.write_text(
        proxy("de-ok", "p-de", on_mismatch="replace")
        + proxy("de-bad", "p-us")
        + proxy("de-replace", "p-us", on_mismatch="replace")
        + proxy("nat-1", "p-nat", expect="")
        + proxy("nat-2", "p-nat", expect="")
    )
    async with echo_server() as echo:
        echo.mapping.update({"127.0.0.2": GERMAN, "127.0.0.3": AMERICAN, "127.0.0.4": SHARED})
        flags = [
            "--providers-config", str(providers),
            "--observe-interval", "1",
            "--egress-echo-url", echo.url,
            "--egress-interval", "2",
            "--egress-max-replacements", "1",
            "--geoip-db", str(country),
            "--geoip-db", str(asn),
            "--unique-egress",
        ]  # fmt: skip
        with hello_target() as target:
            local_dirs = [tmp_path / "instances" / name for name in ("de", "us", "nat")]
            async with running_up(
                tmp_path, *flags, health_check_url=target, local_dirs=local_dirs
            ) as up:
                applied = await up.cli("apply", "-f", str(manifest))
                assert applied.returncode == 0, applied.stdout + applied.stderr

                async def checked() -> bool:
                    found = await views(up)
                    return len(found) == 5 and all(
                        (p.get("egress") or {}).get("ip") for p in found.values()
                    )

                await until(checked, timeout=120.0, what="every proxy's egress checked")
                lease = await _judged(up)
                await _replaced_once(up)
                await _moved_under_a_lease(up, echo.mapping, lease)


async def _judged(up: Up) -> dict[str, Any]:
    """What was seen, placed with both databases; who may be leased for it."""
    found = await views(up)
    ok = found["de-ok"]["egress"]
    assert (ok["ip"], ok["country"], ok["asn"], ok["org"]) == (
        GERMAN,
        "DE",
        3320,
        "Deutsche Telekom AG",
    )
    assert "GeoLite2-Country 2026-11-28" in ok["db"]
    assert found["de-bad"]["egress"]["country"] == "US"
    assert found["de-bad"]["egress"]["notLeasableBecause"] == "egress_mismatch"
    assert found["de-bad"]["available"] is False
    nat = {found[n]["uid"]: found[n]["egress"] for n in ("nat-1", "nat-2")}
    shared = [e for e in nat.values() if e["shared"]]
    assert len(shared) == 2  # both flagged
    assert sorted(e["notLeasableBecause"] for e in nat.values()) == ["", "egress_shared"]

    # The German one is leasable by what was seen; the American one is refused, and why.
    status, body = await up.api_call(
        "POST", "/v1/leases", {"selector": {"role": "de-bad"}, "ttlSeconds": 30, "holder": "c1"}
    )
    assert status == 503, body
    assert "egress_mismatch" in body["message"]
    assert "country US, expected DE" in body["message"]
    status, body = await up.api_call(
        "POST",
        "/v1/leases",
        {"selector": {"egress.country": "DE", "egress.asn": "AS3320"}, "ttlSeconds": 60},
    )
    assert status == 201, body
    assert body["proxy"]["name"] == "de-ok"
    assert body["proxy"]["egress"]["ip"] == GERMAN
    lease: dict[str, Any] = body
    listed = await up.cli("get", "-n", "crawl", "-o", "wide")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert GERMAN in listed.stdout
    assert AMERICAN in listed.stdout
    return lease


async def _replaced_once(up: Up) -> None:
    """onMismatch: replace rotates the proxy, once (--egress-max-replacements 1): the fresh
    instance leaves from America too, and the proxy stays out of leasing."""

    async def replaced() -> bool:
        found = (await views(up))["de-replace"]
        egress = found.get("egress") or {}
        rotations = [
            e
            for e in await proxy_events(up)
            if e["type"] == "RotationRequested" and e["event"].get("reason") == "EgressMismatch"
        ]
        first = rotations[0]["event"]["uid"] if rotations else ""
        return first == found["uid"] and egress.get("country") == "US" and found["phase"] == "Ready"

    await until(replaced, timeout=120.0, what="de-replace replaced for its egress")
    before = (await views(up))["de-replace"]
    await until(
        lambda: _settled(up, before["uid"]), timeout=60.0, what="the replacement taking over"
    )
    events = await proxy_events(up)
    uid = before["uid"]
    asked = [
        e
        for e in events
        if e["type"] == "RotationRequested"
        and e["event"].get("reason") == "EgressMismatch"
        and e["event"]["uid"] == uid
    ]
    assert len(asked) == 1, asked  # the bound
    kept = (await views(up))["de-bad"]["uid"]
    assert not any(
        e["event"].get("reason") == "EgressMismatch" and e["event"]["uid"] == kept
        for e in events
        if e["type"] == "RotationRequested"
    )  # keep: never replaced
    after = (await views(up))["de-replace"]
    assert after["egress"]["notLeasableBecause"] == "egress_mismatch"


async def _settled(up: Up, uid: str) -> bool:
    promoted = [
        e
        for e in await proxy_events(up)
        if e["type"] == "ReplacementPromoted" and uid in e.get("subject", "")
    ]
    return bool(promoted)


async def _moved_under_a_lease(up: Up, mapping: dict[str, str], lease: dict[str, Any]) -> None:
    """The German address moves to an American one under a lease: the change is recorded with
    the old and the new, the proxy is rotated make-before-break, and the lease moves with it."""
    found = (await views(up))["de-ok"]
    uid = found["uid"]
    assert lease["proxy"]["uid"] == uid
    mapping["127.0.0.2"] = MOVED

    async def changed() -> bool:
        return any(
            e["type"] == "EgressChanged" and e["event"]["ip"] == MOVED
            for e in await proxy_events(up)
        )

    await until(changed, timeout=60.0, what="the change of address recorded")
    mapping["127.0.0.2"] = GERMAN  # the fresh instance leaves from Germany again
    change = next(e for e in await proxy_events(up) if e["type"] == "EgressChanged")
    assert change["event"]["old_ip"] == GERMAN
    assert change["event"]["old_country"] == "DE"

    async def switched() -> bool:
        got = await up.cli("events", "--stream", "LEASE", "-o", "json")
        return any(
            json.loads(line)["type"] == "LeaseSwitched"
            for line in got.stdout.splitlines()
            if line.strip() and uid in line
        )

    await until(switched, timeout=120.0, what="the lease switched to the fresh instance")
    # The holder kept its lease through the rotation, now on the fresh instance.
    status, held = await up.api_call("GET", f"/v1/leases/{lease['id']}")
    assert status == 200, held
    assert held["proxy"]["uid"] == uid
    assert held["proxy"]["url"] != lease["proxy"]["url"]
    assert (await views(up))["de-ok"]["leased"] is True
