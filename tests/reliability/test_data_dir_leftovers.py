"""What a dead `up` leaves on its data dir, and the next `up`
(docs/decisions/0094-one-data-dir-one-up-one-nats.md).

Its nats-server dies with it, even when `up` is SIGKILLed, and its announcement is then read as
stale. A nats-server left running on the store anyway (an older version, a platform without a
parent-death signal) is stopped by the next `up`, which then serves, alone on the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest

from services.runtime.nats.registry import registry_dir, registry_entry
from services.runtime.nats.server import CONFIG_FILE, PID_FILE, EmbeddedNatsServer, find_binary
from services.runtime.nats.stale import announced_credentials
from services.runtime.ports import free_port
from tests.support.cli_process import alive, read_line
from tests.support.system import ROOT, base_env, processes_mentioning, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


def entries_naming(credentials: Path) -> list[str]:
    return [
        entry.name
        for entry in sorted(registry_dir().glob("nats-*.json"))
        if str(credentials) in entry.read_text()
    ]


async def test_a_killed_up_takes_its_nats_server_along(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    nats = data_dir / "nats"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli.main", "up", "--data-dir", str(data_dir),
        "--nats-port", str(port), "--api-port", str(free_port()), "--metrics-port", "0",
        "--gateway-port", str(free_port()),
        env=base_env(), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        said = ""
        while "Ctrl-C" not in said:
            said += await read_line(process.stdout, timeout=60)
        server = int((nats / PID_FILE).read_text().strip())
        assert announced_credentials(port) == nats / "credentials.json"
    finally:
        process.kill()
        await process.wait()
    await until(lambda: not alive(server), timeout=10, what="the nats-server's exit")
    assert processes_mentioning(str(nats / CONFIG_FILE)) == []
    # Its announcement is still there, and read as stale: no client takes these credentials
    # to whatever listens on that port now.
    assert registry_entry(port).exists()
    assert announced_credentials(port) is None

    async with running_up(tmp_path) as up:
        assert await up.proxies() == []
        # The next `up` removed the dead server's entry and announced its own.
        new_port = int(up.env["NATS_URL"].rsplit(":", 1)[1])
        assert entries_naming(nats / "credentials.json") == [registry_entry(new_port).name]
        assert announced_credentials(new_port) == nats / "credentials.json"


async def test_a_nats_server_left_on_the_store_is_stopped_by_the_next_up(tmp_path: Path) -> None:
    nats = tmp_path / "data" / "nats"
    config = EmbeddedNatsServer(data_dir=nats).write_config()
    # Started as `up` starts it, but detached and without the parent-death signal: as an older
    # version, or `up` on a platform without one, leaves it when it is killed.
    with (nats / "stray.log").open("ab") as out:
        stray = await asyncio.create_subprocess_exec(
            str(find_binary()), "-c", str(config), stdout=out, stderr=out, start_new_session=True
        )
    try:
        await until((nats / PID_FILE).is_file, timeout=30, what="the stray's pid file")
        assert processes_mentioning(str(config)) == [stray.pid]
        async with running_up(tmp_path) as up:
            assert not alive(stray.pid)
            (server,) = processes_mentioning(str(config))
            assert server != stray.pid
            assert int((nats / PID_FILE).read_text().strip()) == server
            assert up.output.count(b"stopping a nats-server left running") == 1
            assert await up.proxies() == []
            assert processes_mentioning(str(config)) == [server]
    finally:
        if stray.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                stray.kill()
        await stray.wait()
