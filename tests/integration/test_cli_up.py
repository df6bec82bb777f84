"""``up``: each service gets its flags, busy ports are named by their flag, and the whole system
starts and stops cleanly on Ctrl-C or SIGTERM.

In-process runs use the test services (tests/support/cli_services.py); the end-to-end test runs
``up`` as a real process with the real services and an embedded nats-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from events import subjects
from services.cli.run import registry
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import Connection, connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.ports import free_port
from tests.support.cli_process import ROOT, alive, clean_env, read_line
from tests.support.cli_services import Registered
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration


restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_up_passes_each_service_its_flags(
    registered: Registered,
    tmp_path: Path,
    conn: Connection,
    jetstream_store: JetStreamEventStore,
    nats_server: EmbeddedNatsServer,
) -> None:
    providers = tmp_path / "providers.yaml"
    providers.write_text("providers: {}\n")
    helped = await cli("up", "--help")
    for flag in ("--uid", "--count", "--fail", "--api-port", "--providers-config"):
        assert flag in helped.stdout
    # The recorder's --port is fed by --api-port in `up`; shown twice it would be ambiguous.
    assert re.search(r"(?<![\w-])--port\b", helped.stdout) is None
    result = await cli(
        "up",
        *("--uid", "p9", "--count", "2", "--api-port", "9999"),
        *("--providers-config", str(providers), "--metrics-port", "0"),
        *("--data-dir", str(tmp_path / "data"), "--nats-url", nats_server.url),
    )
    assert result.exit_code == 0, result.output
    assert "appender, recorder" in result.stdout
    assert nats_server.url in result.stdout
    assert "(external)" in result.stdout
    assert not (tmp_path / "data").exists()
    history = await jetstream_store.read(subjects.proxy("p9"))
    assert len(history.events) == 2
    built = registered.built[-1]
    assert built["port"] == 9999
    assert built["providers_config"] == providers


async def test_up_refuses_a_nats_port_with_an_external_server(tmp_path: Path) -> None:
    result = await cli("up", "--nats-port", "4333", "--nats-url", "nats://127.0.0.1:4222")
    assert result.exit_code == 2
    assert "--nats-port only applies to the embedded nats-server" in result.stderr


async def test_up_requires_the_providers_file_to_exist(tmp_path: Path) -> None:
    result = await cli("up", "--providers-config", str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2
    assert "--providers-config" in result.stderr


async def test_up_reports_a_busy_metrics_port(nats_server: EmbeddedNatsServer) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = await cli("up", "--metrics-port", str(port), "--nats-url", nats_server.url)
    assert result.exit_code == 2
    assert "--metrics-port" in result.stderr
    assert "choose a free port" in result.stderr


@pytest.mark.parametrize(
    ("flag", "extra"), [("--api-port", True), ("--gateway-port", True), ("--nats-port", False)]
)
async def test_up_names_the_flag_of_a_busy_port(
    nats_server: EmbeddedNatsServer, tmp_path: Path, flag: str, extra: bool
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        where = ["--nats-url", nats_server.url] if extra else ["--data-dir", str(tmp_path)]
        for other in ("--api-port", "--gateway-port"):  # free, so only the busy one is named
            if other != flag:
                where += [other, str(free_port())]
        result = await cli("up", flag, port, "--metrics-port", "0", *where)
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "Traceback" not in result.output


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # The command name is in parentheses and may contain spaces: parse after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_up_runs_the_system_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    nats_port, metrics_port, api_port, gateway_port = (free_port() for _ in range(4))
    data = tmp_path / "data"
    with (tmp_path / "up.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.cli.main", "up", "--data-dir", str(data)),
            *("--nats-port", str(nats_port), "--metrics-port", str(metrics_port)),
            *("--api-port", str(api_port), "--gateway-port", str(gateway_port)),
            cwd=ROOT,
            # Wide enough for the data dir whole, however deep the run's temporary folder is.
            env=clean_env(COLUMNS="240"),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    nats_pids: list[int] = []
    try:
        assert process.stdout is not None
        banner = ""
        while "Ctrl-C to stop" not in banner:
            banner += await read_line(process.stdout)
        url = f"nats://127.0.0.1:{nats_port}"
        assert f"{url}  (embedded)" in banner
        assert f"http://127.0.0.1:{metrics_port}/metrics" in banner
        assert re.search(rf"discovery +http://127\.0\.0\.1:{api_port}", banner)
        assert re.search(rf"gateway +http://127\.0\.0\.1:{gateway_port}", banner)
        # The tests name a check URL (conftest), so `up` serves no probe target of its own.
        assert re.search(r"health check +http://127\.0\.0\.1:9/", banner)
        running = re.search(r"services\s+(.*?)\s*│", banner)
        assert running is not None
        in_up = [name for name, entry in registry.SERVICES.items() if not entry.up_optional]
        assert sorted(running.group(1).split(", ")) == sorted(in_up)
        assert str(data.resolve()) in banner
        nats_pids = children_of(process.pid)
        assert len(nats_pids) == 1
        assert (data / "nats" / "jetstream").is_dir()

        conn = await connect(url)
        try:
            for spec in STREAMS:
                info = await conn.js.stream_info(spec.name)
                assert info.config.subjects == list(spec.subjects)
        finally:
            await conn.close()

        response = await asyncio.to_thread(
            urllib.request.urlopen, f"http://127.0.0.1:{metrics_port}/metrics", timeout=10
        )
        with response:
            assert response.status == 200
            assert b"egress_consumer_lag_messages" in response.read()

        process.send_signal(stop)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert not alive(nats_pids[0])
        logged = (tmp_path / "up.log").read_text()
        assert "Traceback" not in logged, logged
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        for pid in nats_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
