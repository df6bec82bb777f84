"""A Proxy applied under a pool member's name is refused naming the pool, and the member is
left as its pool declared it (docs/decisions/0137-a-pool-member-is-the-pools.md). Before, the
apply printed "changed" and the pool put the member back: two spec changes per apply, the
``pool`` attribute briefly gone, so a lease selecting ``{pool: de}`` could miss it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from events import subjects
from events.customresource import cli_uid
from events.poolresource import pool_uid
from projections.pool import fold as fold_pool
from projections.proxy import fold as fold_proxy
from services.pools.controller import Controller
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.pool_yaml import manifest, pool, proxy

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


async def test_applying_a_proxy_named_like_a_member_is_refused_naming_the_pool(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    assert (await cli("apply", "-f", manifest(tmp_path, pool(replicas=2)), *url)).exit_code == 0
    history = await jetstream_store.read(subjects.pool(pool_uid("crawl", "de")))
    view = fold_pool(list(history.events))
    assert view is not None
    # The pool's controller declares its members, as it does in `up`.
    outcome = await Controller(jetstream_store).evaluate(view, {}, {}, datetime.now(UTC))
    assert len(outcome.declared) == 2, outcome
    member = outcome.declared[0]
    aggregate = subjects.proxy(cli_uid("crawl", member))
    before = (await jetstream_store.read(aggregate)).events

    refused = await cli("apply", "-f", manifest(tmp_path, proxy(member, country="fr")), *url)
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert f"proxy crawl/{member} is a member of pool crawl/de" in said, said
    assert "changed" not in said.replace("nothing was changed", "")
    after = (await jetstream_store.read(aggregate)).events
    assert after == before, "nothing appended: the member is as its pool declared it"
    member_view = fold_proxy(after)
    assert member_view is not None
    assert member_view.spec.attributes == {"country": "de", "pool": "de"}
