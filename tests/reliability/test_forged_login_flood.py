"""A lease id is not a login (docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md).

Squid caches a checked Basic credential by user name alone: a request whose password differs
from the cached one resets the entry, and whatever check answers last holds for every request
queued on it. With the lease id as the user name, anyone who had read the id (a `read` client
sees it on the console) sent it with any password beside the holder's traffic: some of their
requests passed on the holder's check, and some of the holder's were refused on theirs. The
probe's fixed user name had the same hole.

A real Squid started by the local provider with the real helper; the holder's 10 keep-alive
connections and 30 forgers' send at once for a few seconds. A status other than 407 is a
credential that passed (the destination rules may answer 403 after it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from services.providers.local import LocalProvider
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure import scheme
from tests.integration.test_proxy_auth import MASTER, start
from tests.support.auth_flood import Counts, basic, flood, wrong_password
from tests.support.squid_fixtures import local_squids, origin_url  # noqa: F401  # fixtures `local` and `target`

pytestmark = pytest.mark.reliability

SECONDS = 3.0
LEASE_ID = "6f1c8a52-5a8e-4a57-9c55-3b1f0e8c2d11"


def forgers(name: str, password: str) -> dict[str, Callable[[], bytes]]:
    """Forged credentials for a user ``name``: a fixed wrong password (what rides on a cached
    check), and a new wrong one on every request (what resets the entry every time)."""
    fixed = basic(name, "x")
    return {"fixed": lambda: fixed, "changing": lambda: basic(name, wrong_password(password))}


def held(counts: Counts) -> None:
    assert sum(counts.holder.values()) > 100, counts.summary()
    assert sum(counts.forged.values()) > 100, counts.summary()
    assert set(counts.forged) == {407}, f"forged requests passed: {counts.summary()}"
    assert 407 not in counts.holder, f"the holder was refused: {counts.summary()}"
    assert 0 not in counts.holder, f"the holder's connection failed: {counts.summary()}"


@pytest.mark.parametrize("forged", ["fixed", "changing"])
async def test_the_lease_id_with_any_password_neither_passes_nor_costs_the_holder(
    local: LocalProvider, target: str, forged: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, f"px-forge-{forged}")
    key = scheme.proxy_key(MASTER, proxy.uid)
    expires = time.time_ns() // 10**6 + 600_000
    user, password = scheme.lease_credential(
        key, "6f1c8a52-5a8e-4a57-9c55-3b1f0e8c2d11", 5, expires
    )
    holder = basic(user, password)
    lease_id = scheme.lease_id_of(user)
    counts = await flood(
        proxy.url, target, lambda: holder, forgers(lease_id, password)[forged], seconds=SECONDS
    )
    held(counts)


@pytest.mark.parametrize("forged", ["fixed", "changing"])
async def test_the_probe_name_with_any_password_neither_passes_nor_costs_the_probe(
    local: LocalProvider, target: str, forged: str
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, f"px-probe-{forged}")
    key = scheme.proxy_key(MASTER, proxy.uid)
    probe = scheme.probe_credential(key, time.time_ns() // 10**6 + 300_000)
    holder = basic(*probe)
    counts = await flood(
        proxy.url,
        target,
        lambda: holder,
        forgers(scheme.PROBE_USER, probe.password)[forged],
        seconds=SECONDS,
    )
    held(counts)
