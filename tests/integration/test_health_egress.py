"""The health service's egress checks against a real nats-server, a real Squid leaving from its
own loopback address and an echo server that maps it to a public test address placed by real
MaxMind files (docs/decisions/0111-verified-egress.md): a finding is appended once, a check that
confirms it appends nothing, a moved address is a change with the old and the new, and an echo
that answers garbage, HTML, an error or nothing gives a finding that says so, never a crash."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events import subjects
from events.egress import EgressChanged, EgressObserved
from events.schemas import InstanceState
from services.health.egress import EgressSettings
from services.health.service import HealthService
from services.providers.local import LocalProvider
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.contract.provider import delete_all, request_factory
from tests.support.echo import echo_server
from tests.support.health import RecordingTarget, declare_ready, fast_check, start_replica
from tests.support.mmdb import write_asn_db, write_country_db
from tests.support.waiting import until

pytestmark = pytest.mark.integration

SOURCE = "127.0.0.5"


@pytest.fixture
async def squid_at_source(tmp_path: Path) -> AsyncIterator[str]:
    """A Squid whose connections to targets come from ``SOURCE``; yields its URL."""
    provider = LocalProvider(
        "egress", tmp_path / "squid", backend="squid", stop_grace=0.5, outgoing=SOURCE
    )
    provider_id = await provider.create(request_factory("egress")("px"))

    async def running() -> bool:
        return (await provider.get(provider_id)).state is InstanceState.RUNNING

    await until(running, 30.0, what="the Squid Running")
    yield f"http://127.0.0.1:{(await provider.get(provider_id)).port}"
    await delete_all(provider)


async def findings(store: JetStreamEventStore, uid: str) -> list[EgressObserved]:
    history = await store.read(subjects.proxy(uid))
    return [r.event for r in history.events if isinstance(r.event, EgressObserved)]


async def test_findings_are_appended_on_change_only_and_say_what_went_wrong(
    nats_server: EmbeddedNatsServer,
    jetstream_store: JetStreamEventStore,
    squid_at_source: str,
    target: RecordingTarget,
    tmp_path: Path,
) -> None:
    geo = (
        write_country_db(tmp_path / "c.mmdb", {"203.0.113.0/24": "DE", "198.51.100.0/24": "US"}),
        write_asn_db(tmp_path / "a.mmdb", {"203.0.113.0/24": (3320, "Deutsche Telekom AG")}),
    )
    async with echo_server() as echo:
        echo.mapping[SOURCE] = "203.0.113.5"
        service = HealthService(
            replica_id="solo",
            check_url=target.url(),
            egress=EgressSettings(echo_url=echo.url, interval=0.3, timeout=1.0),
            geoip_db=geo,
        )
        await declare_ready(jetstream_store, "p1", squid_at_source, fast_check(target.url()))
        replica = await start_replica(nats_server.url, service)
        try:

            async def found(n: int) -> bool:
                return len(await findings(jetstream_store, "p1")) >= n

            await until(lambda: found(1), 30.0, what="the first finding")
            first = (await findings(jetstream_store, "p1"))[0]
            assert (first.ip, first.scope, first.country, first.asn, first.org) == (
                "203.0.113.5",
                "public",
                "DE",
                3320,
                "Deutsche Telekom AG",
            )
            assert "GeoLite2-Country 2026-11-28" in first.db
            assert first.provider_id == "inst-p1"

            # Checks go on every 0.3 s and find the same: nothing more is appended.
            checker = replica.service.prober.egress  # type: ignore[union-attr]
            assert checker is not None
            done = checker.checks
            await until(lambda: checker.checks >= done + 3, 30.0, what="three more checks")
            assert len(await findings(jetstream_store, "p1")) == 1

            # The address moves: one change, with the old and the new.
            echo.mapping[SOURCE] = "198.51.100.7"
            await until(lambda: found(2), 30.0, what="the change")
            change = (await findings(jetstream_store, "p1"))[1]
            assert isinstance(change, EgressChanged)
            assert (change.old_ip, change.ip, change.country) == (
                "203.0.113.5",
                "198.51.100.7",
                "US",
            )

            # An echo that goes wrong, each way: a finding that says why, once per reason.
            for behaviour, said in (
                ("html", "HTML"),
                ("error", "HTTP 500"),
                ("hang", "no answer within 1s"),
            ):
                count = len(await findings(jetstream_store, "p1"))
                echo.behaviour[SOURCE] = behaviour
                await until(
                    functools.partial(found, count + 1), 30.0, what=f"the {behaviour} finding"
                )
                bad = (await findings(jetstream_store, "p1"))[-1]
                assert bad.ip == ""
                assert said in bad.error, bad.error
                # The proxy itself is fine: it stays healthy, and the service goes on.
                assert not replica.task.done()
            del echo.behaviour[SOURCE]
            await until(
                lambda: _last_ip(jetstream_store, "198.51.100.7"), 30.0, what="a good finding again"
            )
        finally:
            await replica.stop()


async def _last_ip(store: JetStreamEventStore, ip: str) -> bool:
    found = await findings(store, "p1")
    return bool(found) and found[-1].ip == ip and not found[-1].error
