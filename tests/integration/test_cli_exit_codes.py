"""The exit codes scripts act on, across commands: bad usage (2), nats-server unreachable (3), and
the list of them in ``--help``."""

from __future__ import annotations

import pytest

from services.runtime.ports import free_port
from tests.support.cli_services import Registered
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_unknown_service_lists_the_known_ones(registered: Registered) -> None:
    result = await cli("run", "nonesuch")
    assert result.exit_code == 2
    assert "unknown service 'nonesuch'; known: appender, recorder" in result.stderr


async def test_bad_nats_url_names_the_flag() -> None:
    result = await cli("events", "--nats-url", "http://127.0.0.1:4222")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --nats-url / NATS_URL: 'http://127.0.0.1:4222'")
    assert len(result.stderr.splitlines()) == 1


async def test_bad_nats_url_from_the_environment() -> None:
    result = await cli("streams", "info", NATS_URL="nats://")
    assert result.exit_code == 2
    assert "--nats-url / NATS_URL" in result.stderr


@pytest.mark.parametrize(
    "command",
    [("events",), ("streams", "info"), ("streams", "init"), ("run", "appender", "--uid", "x")],
)
async def test_unreachable_nats_exits_3(registered: Registered, command: tuple[str, ...]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = await cli(*command, "--nats-url", url)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(f"error: cannot reach nats-server at {url}")
    assert "Traceback" not in result.output


async def test_help_documents_the_exit_codes() -> None:
    result = await cli("--help")
    assert result.exit_code == 0
    for line in ("2  bad usage", "3  nats-server unreachable", "4  event log", "5  the embedded"):
        assert line in result.stdout
    version = await cli("--version")
    assert version.stdout.strip() == "egress-proxies, version 0.1.0"
