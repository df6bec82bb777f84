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


async def flood_beside(
    local: LocalProvider,
    target: str,
    name: str,
    login: Callable[[bytes], tuple[str, str, str]],
    forged: str,
) -> None:
    """A proxy ``name`` whose one rightful login comes from ``login`` (given the proxy's key: the
    user name, the password, and the user name forgers send), flooded beside that login's
    traffic by forgers of the ``forged`` kind; the holder passes and they do not."""
    proxy = await start(lease_keyed(local, MASTER), local, name)
    user, password, forged_user = login(scheme.proxy_key(MASTER, proxy.uid))
    holder = basic(user, password)
    counts = await flood(
        proxy.url, target, lambda: holder, forgers(forged_user, password)[forged], seconds=SECONDS
    )
    held(counts)


def lease_login(key: bytes) -> tuple[str, str, str]:
    """A lease's credential; forgers send its lease id."""
    expires = time.time_ns() // 10**6 + 600_000
    user, password = scheme.lease_credential(key, LEASE_ID, 5, expires)
    return user, password, scheme.lease_id_of(user)


def probe_login(key: bytes) -> tuple[str, str, str]:
    """The health probe's credential; forgers send the probe's fixed user name."""
    user, password = scheme.probe_credential(key, time.time_ns() // 10**6 + 300_000)
    return user, password, scheme.PROBE_USER


@pytest.mark.parametrize("forged", ["fixed", "changing"])
async def test_the_lease_id_with_any_password_neither_passes_nor_costs_the_holder(
    local: LocalProvider, target: str, forged: str
) -> None:
    await flood_beside(local, target, f"px-forge-{forged}", lease_login, forged)


@pytest.mark.parametrize("forged", ["fixed", "changing"])
async def test_the_probe_name_with_any_password_neither_passes_nor_costs_the_probe(
    local: LocalProvider, target: str, forged: str
) -> None:
    await flood_beside(local, target, f"px-probe-{forged}", probe_login, forged)
