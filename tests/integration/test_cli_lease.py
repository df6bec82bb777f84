"""``lease acquire|release|report`` against a real discovery service, and the lease columns of
``get``: what an operator sees, what lands in the log, and the exit codes scripts act on."""

from __future__ import annotations

import json
import socket

import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased, LeaseReported
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

TOKEN = "t0ken"


def free_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_acquire_report_release(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de1", {"country": "de", "tier": "gold"}, port=3001)
    async with discovery(nats_server.url, max_lease_ttl=600, lease_cooldown=60) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli(
            "lease", "acquire", "--selector", "country=de", "-l", "tier=gold",
            "--ttl", "2h", "--holder", "crawler-7", "-o", "json", **env,
        )  # fmt: skip
        assert got.exit_code == 0, got.output
        lease = json.loads(got.stdout)
        assert lease["proxy"]["url"] == "http://127.0.0.1:3001"
        assert (lease["ttlSeconds"], lease["ttlClamped"]) == (600, True)

        listed = await cli("get", "--nats-url", nats_server.url)
        header, row = listed.stdout.splitlines()
        assert header.split() == [
            "NAMESPACE", "NAME", "PHASE", "IP", "PROVIDER", "HEALTH", "LEASED", "COOLDOWN", "AGE",
        ]  # fmt: skip
        assert row.split()[6:8] == ["crawler-7", "-"]
        items = json.loads((await cli("get", "-o", "json", "--nats-url", nats_server.url)).stdout)
        (shown,) = items["items"]
        assert (shown["leased"], shown["leaseId"], shown["cooldownUntil"]) == (
            True,
            lease["id"],
            None,
        )

        reported = await cli(
            "lease", "report", lease["id"], "--outcome", "blocked",
            "--target", "shop.example", "--detail", "HTTP 403", **env,
        )  # fmt: skip
        assert reported.exit_code == 0, reported.output
        assert f"lease {lease['id']}: reported blocked" in reported.stdout
        released = await cli("lease", "release", lease["id"], "-o", "json", **env)
        assert released.exit_code == 0, released.output
        assert json.loads(released.stdout) == {"id": lease["id"], "released": True}

        items = json.loads((await cli("get", "-o", "json", "--nats-url", nats_server.url)).stdout)
        (shown,) = items["items"]
        assert (shown["leased"], shown["leaseId"]) == (False, None)
        assert shown["cooldownUntil"].endswith("Z")
        row = (await cli("get", "--nats-url", nats_server.url)).stdout.splitlines()[1]
        leased, cooldown = row.split()[6:8]
        assert leased == "no"
        assert 58 <= int(cooldown.removesuffix("s")) <= 60

    history = await jetstream_store.read(subjects.lease("de1"))
    claim, report, release = (r.event for r in history.events)
    assert isinstance(claim, LeaseAcquired)
    assert (claim.holder, claim.selector) == ("crawler-7", {"country": "de", "tier": "gold"})
    assert (claim.ttl_seconds, claim.requested_ttl_seconds) == (600, 7200)
    assert isinstance(report, LeaseReported)
    assert (report.outcome, report.target, report.detail) == ("blocked", "shop.example", "HTTP 403")
    assert isinstance(release, LeaseReleased)


async def test_table_output_and_the_exit_codes_scripts_act_on(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "p1", {"country": "de"})
    async with discovery(nats_server.url, token=TOKEN) as (_, base):
        env = {"DISCOVERY_URL": base, "DISCOVERY_TOKEN": TOKEN}
        got = await cli("lease", "acquire", "--ttl", "60", **env)
        assert got.exit_code == 0, got.output
        lines = dict(line.split(None, 1) for line in got.stdout.splitlines())
        lease_id = lines["lease"].strip()
        assert lines["url"].strip() == "http://127.0.0.1:3128"
        assert lines["ttl"].strip() == "60s"

        busy = await cli("lease", "acquire", **env)
        assert busy.exit_code == 6, busy.output
        assert "no proxy available" in busy.stderr
        assert "try again in" in busy.stderr
        # No proxy has the attributes: 422, which this CLI exits 8 on (retrying will not help).
        nothing = await cli("lease", "acquire", "--selector", "country=fr", **env)
        assert nothing.exit_code == 8, nothing.output
        assert "no proxy has the attributes" in nothing.stderr

        assert (await cli("lease", "release", lease_id, **env)).exit_code == 0
        # Releasing again is harmless (a retry): the lease is over, as asked.
        assert (await cli("lease", "release", lease_id, **env)).exit_code == 0
        for args in (
            ("report", lease_id, "--outcome", "success"),
            ("release", "no-such-lease"),
        ):
            gone = await cli("lease", *args, **env)
            assert gone.exit_code == 7, (args, gone.output)
            assert "no active lease" in gone.stderr
            assert "Traceback" not in gone.output

        refused = await cli("lease", "acquire", DISCOVERY_URL=base, DISCOVERY_TOKEN="wrong")
        assert refused.exit_code == 2
        assert "DISCOVERY_TOKEN" in refused.stderr


async def test_an_unreachable_api_exits_3() -> None:
    url = free_url()
    for args in (("acquire",), ("release", "x"), ("report", "x", "--outcome", "failed")):
        result = await cli("lease", *args, "--api-url", url)
        assert result.exit_code == 3, result.output
        assert f"cannot reach the discovery API at {url}" in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("acquire", "--selector", "country"), "--selector"),
        (("acquire", "--ttl", "soon"), "--ttl"),
        (("acquire", "--ttl", "0"), "--ttl"),
        (("acquire", "--api-url", "localhost:8080"), "--api-url"),
        (("report", "x", "--outcome", "captcha"), "--outcome"),
        (("report", "x"), "--outcome"),
        (("release",), "LEASE_ID"),
    ],
)
async def test_usage_errors_exit_2(args: tuple[str, ...], named: str) -> None:
    result = await cli("lease", *args, DISCOVERY_URL=free_url())  # never reached
    assert result.exit_code == 2, result.output
    assert named in result.output


async def test_help_documents_the_lease_exit_codes() -> None:
    result = await cli("--help")
    assert "6  lease acquire: no proxy available" in result.stdout
    assert "7  lease release / report / renew: unknown lease" in result.stdout
    assert "8  lease acquire: no proxy matches the selector at all" in result.stdout
    assert "lease" in (await cli("lease", "--help")).stdout
