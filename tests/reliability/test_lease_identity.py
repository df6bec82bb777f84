"""Who holds a lease is an identity, on the whole system
(docs/decisions/0096-a-lease-belongs-to-a-client-a.md).

`up` with a clients file, a real Squid enforcing leases: the victim's lease works through the
proxy; another crawler with a valid token of its own can neither read the victim's working
credentials (by id or by the victim's holder name), nor renew, report on, rotate or end the
lease; the victim's requests through the proxy keep succeeding; and a crawler removed from the
file is refused within a second.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from services.runtime.pure.clients import hash_token
from tests.support.system import fetch_via, hello_target, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

VICTIM, OTHER = "v" * 48, "o" * 48


def clients(*names: str) -> str:
    tokens = {"victim": VICTIM, "other": OTHER}
    lines = ["clients:"]
    for name in names:
        lines += [
            f"  - {{name: {name}, token: '{hash_token(tokens[name])}', scopes: [lease, read]}}"
        ]
    return "\n".join(lines) + "\n"


async def test_another_crawler_cannot_take_or_end_a_lease_it_did_not_acquire(
    tmp_path: Path,
) -> None:
    file = tmp_path / "clients.yaml"
    file.write_text(clients("victim", "other"))
    manifest = tmp_path / "proxy.yaml"
    manifest.write_text(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        "metadata: {name: de-1, namespace: crawl}\n"
        "spec: {provider: local, attributes: {country: de}}\n"
    )
    with hello_target() as target:
        async with running_up(tmp_path, "--clients-file", str(file), health_check_url=target) as up:
            applied = await up.cli("apply", "-f", str(manifest), "--wait", timeout=240)
            assert applied.returncode == 0, applied.stdout + applied.stderr
            async with (
                httpx.AsyncClient(base_url=up.api, headers=_bearer(VICTIM), timeout=30) as victim,
                httpx.AsyncClient(base_url=up.api, headers=_bearer(OTHER), timeout=30) as other,
            ):
                got = await victim.post(
                    "/v1/leases", json={"selector": {"country": "de"}, "holder": "victim-1"}
                )
                assert got.status_code == 201, got.text
                lease = got.json()
                url = lease["proxy"]["url"]
                assert await asyncio.to_thread(fetch_via, url, target) == "hello through the proxy"

                listed = await other.get("/v1/leases", params={"holder": "victim-1"})
                assert listed.json() == {"items": [], "continue": "", "total": 0}
                for method, path, body in [
                    ("GET", f"/v1/leases/{lease['id']}", None),
                    ("PATCH", f"/v1/leases/{lease['id']}", {"ttlSeconds": 1}),
                    ("POST", f"/v1/leases/{lease['id']}/report", {"outcome": "blocked"}),
                    ("POST", f"/v1/leases/{lease['id']}/rotate", None),
                    ("DELETE", f"/v1/leases/{lease['id']}", None),
                ]:
                    refused = await other.request(method, path, json=body)
                    assert refused.status_code == 403, (method, path, refused.text)
                    assert url not in refused.text
                released = await other.delete("/v1/leases", params={"holder": "victim-1"})
                assert released.json() == {"released": 0}

                # The victim's lease is as it was: same token, same expiry, still forwarding.
                mine = await victim.get(f"/v1/leases/{lease['id']}")
                assert mine.status_code == 200
                assert mine.json()["fencingToken"] == lease["fencingToken"]
                assert mine.json()["expiresAt"] == lease["expiresAt"]
                for _ in range(20):
                    fetched = await asyncio.to_thread(fetch_via, url, target)
                    assert fetched == "hello through the proxy"

                # Removed from the file: refused within a second.
                file.write_text(clients("victim"))
                removed = time.monotonic()

                async def refused_now() -> bool:
                    return (await other.get("/v1/proxies")).status_code == 401

                await until(refused_now, timeout=5, every=0.05, what="the removed client refused")
                assert time.monotonic() - removed < 1.0
                assert (await victim.delete(f"/v1/leases/{lease['id']}")).status_code == 204


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
