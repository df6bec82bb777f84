"""The client library against a replica with a clients file: another client's lease is a
``Forbidden``, and a client at its ``maxLeases`` gets a ``LeaseLimit``, which a pool treats as
a busy fleet (a kind of ``NoProxyAvailable``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from egress_proxies_client import AsyncClient, Forbidden, LeaseLimit, NoProxyAvailable
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.client.conftest import ATTRIBUTES, fleet
from tests.support.discovery import discovery

pytestmark = pytest.mark.integration

MINE, THEIRS = "m" * 40, "t" * 40


@pytest.fixture
async def api(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> AsyncIterator[str]:
    await fleet(jetstream_store)
    file = tmp_path / "clients.yaml"
    file.write_text(
        "clients:\n"
        f"  - {{name: mine, token: '{hash_token(MINE)}', scopes: [lease, read], maxLeases: 1}}\n"
        f"  - {{name: theirs, token: '{hash_token(THEIRS)}', scopes: [lease, read]}}\n"
    )
    async with discovery(nats_server.url, clients_file=file) as (_, url):
        yield url


async def test_another_clients_lease_is_forbidden_and_a_limit_is_a_wait(api: str) -> None:
    async with AsyncClient(api, MINE) as mine, AsyncClient(api, THEIRS) as theirs:
        lease = await mine.acquire(ATTRIBUTES, 60)
        for call in (
            theirs.get(lease.id),
            theirs.renew(lease.id, 60),
            theirs.report(lease.id, "blocked", target="shop.example"),
            theirs.release(lease.id),
        ):
            with pytest.raises(Forbidden) as caught:
                await call
            assert (caught.value.status, caught.value.code) == (403, "not_your_lease")
        with pytest.raises(LeaseLimit) as limited:
            await mine.acquire(ATTRIBUTES, 60)
        assert isinstance(limited.value, NoProxyAvailable)
        assert limited.value.retry_after == 1
        assert "maxLeases 1" in limited.value.message
        await mine.release(lease.id)
