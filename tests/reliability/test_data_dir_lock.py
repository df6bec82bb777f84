"""One data dir, one `up` (docs/decisions/0094-one-data-dir-one-up-one-nats.md).

Two nats-servers on one JetStream store each append to their own copy of a stream and the
streams diverge for good. A second `up` on a data dir in use exits 2 naming the pid of the `up`
that holds it, before it starts a server or writes a file: the first keeps serving, alone on its
store, and the contexts and registry entries still name its server.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from services.runtime.datadir import LOCK_FILE
from services.runtime.nats.registry import registry_dir
from services.runtime.nats.server import CONFIG_FILE
from services.runtime.ports import free_port
from tests.support.system import ROOT, base_env, processes_mentioning, running_up

pytestmark = pytest.mark.reliability


def written(data_dir: Path) -> dict[str, bytes]:
    """What a second `up` must leave as it was: the server's files and this user's registry."""
    nats = data_dir / "nats"
    files = [
        data_dir / LOCK_FILE,
        *(nats / name for name in (CONFIG_FILE, "nats-context.json", "nats-reader-context.json")),
        *sorted(registry_dir().glob("*")),
    ]
    return {str(path): path.read_bytes() for path in files if path.is_file()}


async def second_up(data_dir: Path, *extra: str) -> tuple[int, str]:
    """Its exit code and output; one that comes up serving is stopped, and the test fails."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli.main", "up", "--data-dir", str(data_dir),
        "--api-port", str(free_port()), "--gateway-port", str(free_port()), "--metrics-port", "0",
        *extra,
        env=base_env(), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    output = bytearray()
    async with asyncio.timeout(120):
        while line := await process.stdout.readline():
            output += line
            if b"Ctrl-C" in line:
                process.send_signal(signal.SIGINT)
        code = await process.wait()
    text = output.decode()
    assert "Ctrl-C" not in text, f"a second `up` served the same data dir:\n{text}"
    return code, text


async def test_a_second_up_on_a_data_dir_in_use_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with running_up(tmp_path) as up:
        config = str(up.data_dir / "nats" / CONFIG_FILE)
        (server,) = processes_mentioning(config)
        before = written(up.data_dir)
        first_port = up.env["NATS_URL"].rsplit(":", 1)[1]
        # Without --nats-port (it would pick another port), and with the first one's (the
        # lock is named, not the port: leaving the flag out would not help).
        for extra in ((), ("--nats-port", first_port)):
            code, said = await second_up(up.data_dir, *extra)
            assert code == 2, said
            assert f"pid {up.process.pid}" in said, said
            assert "--data-dir" in said, said
            assert "Traceback" not in said, said
            assert up.process.returncode is None, up.output.decode()
            assert processes_mentioning(config) == [server]
            assert written(up.data_dir) == before
        # The first `up` serves on, its server alone on the store.
        assert await up.proxies() == []
        assert processes_mentioning(config) == [server]
