"""`egress-proxies up` supervises its embedded nats-server.

A nats-server killed with SIGKILL comes back on the same store, port and credentials, and the
system carries on (a Proxy applied afterwards becomes Ready). One that cannot come back ends `up`
with exit code 5 and one line saying so. SIGTERM during the outage is still a clean stop: exit 0,
no traceback. Everything runs as a user runs it: `up` and the CLI as processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.runtime.nats.credentials import CREDENTIALS_FILE
from services.runtime.nats.server import PID_FILE
from services.runtime.ports import free_port
from tests.support.cli_process import alive
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
PROXY = """apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: after-the-crash, namespace: supervision}
spec:
  provider: local
"""


def base_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        # No HEALTH_CHECK_URL: `up` then probes its local proxies against a target of its own on
        # loopback, so they become healthy offline, as `apply --wait` requires.
        if not k.startswith(("NATS_", "OTEL_", "DATA_DIR", "METRICS_", "HEALTH_CHECK_URL"))
    }
    return env | {"PYTHONPATH": str(ROOT)}


@dataclass
class Up:
    process: asyncio.subprocess.Process
    data_dir: Path
    nats_port: int
    api_port: int
    output: bytearray = field(default_factory=bytearray)

    @property
    def nats(self) -> Path:
        return self.data_dir / "nats"

    def server_pid(self) -> int:
        return int((self.nats / PID_FILE).read_text().strip())

    def said(self, text: str) -> bool:
        return text.encode() in self.output

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A command from another directory, given only the URL, as in a second terminal."""
        return subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args],
            env=base_env() | {"NATS_URL": f"nats://127.0.0.1:{self.nats_port}"},
            cwd=self.data_dir.parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), 60)


@asynccontextmanager
async def running_up(tmp_path: Path) -> AsyncIterator[Up]:
    data_dir, nats_port, api_port = tmp_path / "data", free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli.main", "up",
        "--data-dir", str(data_dir), "--nats-port", str(nats_port),
        "--api-port", str(api_port), "--metrics-port", "0", "--observe-interval", "1",
        "--gateway-port", str(free_port()),
        env=base_env(), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    up = Up(process, data_dir, nats_port, api_port)
    assert process.stdout is not None
    stream = process.stdout

    async def pump() -> None:
        while line := await stream.readline():
            up.output.extend(line)

    reader = asyncio.create_task(pump())
    try:
        await until(lambda: _now(up.said("Ctrl-C to stop") or process.returncode is not None), 60)
        assert process.returncode is None, up.output.decode()
        yield up
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        with suppress(ProcessLookupError, ValueError, OSError):
            os.kill(up.server_pid(), signal.SIGKILL)
        await reader


async def _now(value: bool) -> bool:
    return value


async def kill_and_hold_port(up: Up) -> socket.socket:
    """SIGKILL the server and take its port, so that it cannot start there again."""
    pid = up.server_pid()
    os.kill(pid, signal.SIGKILL)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for _ in range(400):
        try:
            holder.bind(("127.0.0.1", up.nats_port))
        except OSError:
            await asyncio.sleep(0.002)
            continue
        holder.listen()
        return holder
    holder.close()
    raise AssertionError("the killed server's port never came free")


async def test_a_killed_nats_server_is_restarted_and_the_system_carries_on(
    tmp_path: Path,
) -> None:
    async with running_up(tmp_path) as up:
        credentials = (up.nats / CREDENTIALS_FILE).read_text()
        first = up.server_pid()
        os.kill(first, signal.SIGKILL)

        async def restarted() -> bool:
            with suppress(OSError, ValueError):
                return up.server_pid() != first and alive(up.server_pid())
            return False

        await until(restarted, timeout=30)
        # A restarted server that JetStream keeps from being ready within the 15 s of one
        # attempt is killed and started again by the supervisor (a busy machine, a store being
        # recovered): allow for a second attempt, and say what `up` said if there is none.
        try:
            await until(lambda: _now(up.said("nats-server restarted")), timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"no restart announced; up said:\n{up.output.decode()}") from exc
        assert up.said("nats-server exited; restarting it")

        # The restarted server announces itself when its process runs; its JetStream recovers
        # the streams from the store a moment later. Wait on that condition, as a user would
        # retry a command that found no stream yet, before the work that must carry on.
        async def serving() -> bool:
            return (await asyncio.to_thread(up.cli, "get", "-o", "json")).returncode == 0

        await until(serving, timeout=60)
        manifest = tmp_path / "proxy.yaml"
        manifest.write_text(PROXY)
        applied = await asyncio.to_thread(up.cli, "apply", "-f", str(manifest), "--wait")
        assert applied.returncode == 0, applied.stdout + applied.stderr + up.output.decode()
        listed = await asyncio.to_thread(up.cli, "get", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        (item,) = json.loads(listed.stdout)["items"]
        assert (item["name"], item["phase"]) == ("after-the-crash", "Ready")

        def healthz() -> int:
            url = f"http://127.0.0.1:{up.api_port}/healthz"
            with urllib.request.urlopen(url, timeout=10) as response:
                status: int = response.status
                return status

        async def serving() -> bool:
            # A service whose reads timed out while the server was away is started again by
            # `up` a few seconds after it came back; a request in that moment is reset, so
            # what counts is that discovery serves again, not one request's luck.
            with suppress(OSError):
                return await asyncio.to_thread(healthz) == 200
            return False

        await until(serving, timeout=30, what="discovery answering /healthz with 200")
        # The same credentials, still readable by this user only.
        assert (up.nats / CREDENTIALS_FILE).read_text() == credentials
        assert (up.nats / CREDENTIALS_FILE).stat().st_mode & 0o777 == 0o600

        deleted = await asyncio.to_thread(up.cli, "delete", "-f", str(manifest), "--wait")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        server = up.server_pid()
        assert await up.stop() == 0
        assert not alive(server)
    assert b"Traceback" not in up.output, up.output.decode()


async def test_sigterm_while_the_server_is_down_is_a_clean_stop(tmp_path: Path) -> None:
    async with running_up(tmp_path) as up:
        holder = await kill_and_hold_port(up)
        try:
            await until(lambda: _now(up.said("nats-server restart failed")), timeout=30)
            assert await up.stop() == 0
        finally:
            holder.close()
    text = up.output.decode()
    assert "Traceback" not in text, text
    assert "stopped" in text.splitlines()[-1]


async def test_up_exits_5_when_the_server_cannot_come_back(tmp_path: Path) -> None:
    async with running_up(tmp_path) as up:
        holder = await kill_and_hold_port(up)
        try:
            code = await asyncio.wait_for(up.process.wait(), 90)
        finally:
            holder.close()
    text = up.output.decode()
    assert code == 5, text
    assert "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last.startswith("error: the embedded nats-server exited (-9) and could not be restarted")
    assert "nats-server.log" in last
