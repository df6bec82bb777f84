"""``run NAME``: a service from the registry built with its flags, run against a real
nats-server, its failure mapped to an exit code.

The registry holds only the test services (tests/support/cli_services.py), which end by
themselves.
"""

from __future__ import annotations

import pytest

from events import subjects
from events.schemas import HealthChanged
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.cli_services import Registered
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_run_starts_a_registered_service_with_its_flags(
    registered: Registered,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    nats_server: EmbeddedNatsServer,
) -> None:
    result = await cli(
        "run",
        "appender",
        "--uid",
        "p7",
        "--count",
        "3",
        "--metrics-port",
        "0",
        "--nats-url",
        nats_server.url,
    )
    assert result.exit_code == 0, result.output
    history = await jetstream_store.read(subjects.proxy("p7"))
    assert [r.event for r in history.events] == [
        HealthChanged(healthy=True, reason="r0"),
        HealthChanged(healthy=False, reason="r1"),
        HealthChanged(healthy=True, reason="r2"),
    ]
    recorded = await cli(
        "run", "recorder", "--port", "1234", "--metrics-port", "0", "--nats-url", nats_server.url
    )
    assert recorded.exit_code == 0, recorded.output
    built = registered.built[-1]
    assert built["port"] == 1234
    assert built["settings"].service_name == "egress-proxies-recorder"
    assert built["settings"].nats_url == nats_server.url


async def test_run_maps_a_failing_service_to_its_exit_code(
    registered: Registered, nats_server: EmbeddedNatsServer
) -> None:
    result = await cli(
        "run",
        "appender",
        "--uid",
        "p8",
        "--fail",
        "--metrics-port",
        "0",
        "--nats-url",
        nats_server.url,
    )
    assert result.exit_code == 4
    assert result.stderr.strip().endswith("error: appender gave up on purpose")


async def test_run_help_lists_the_services_and_their_flags(registered: Registered) -> None:
    listing = await cli("run", "--help")
    assert "appender" in listing.stdout
    assert "recorder" in listing.stdout
    one = await cli("run", "appender", "--help")
    for flag in ("--uid", "--count", "--fail", "--nats-url", "--metrics-port"):
        assert flag in one.stdout
