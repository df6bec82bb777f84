"""What the commands find from a data dir (docs/decisions/0147-the-cli-as-one-language.md): the
``lease`` commands reach the API of the `up` running on it, whatever its ``--api-port``, and
``local stop`` stops the local proxies an `up` left on it, refusing while an `up` runs there."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.lease.apiaddress import API_FILE
from services.providers.local_process import PID_FILE
from services.runtime.datadir import exclusive
from services.runtime.ports import free_port
from tests.support.cli_process import ROOT, alive, clean_env, read_line
from tests.support.clirun import cli, restore_logging_after
from tests.support.waiting import until

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)


async def test_lease_commands_find_the_api_of_up_on_the_data_dir(tmp_path: Path) -> None:
    api_port = free_port()
    data = tmp_path / "data"
    with (tmp_path / "up.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.cli.main", "up", "--data-dir", str(data)),
            *("--nats-port", str(free_port()), "--metrics-port", "0"),
            *("--api-port", str(api_port), "--gateway-port", str(free_port())),
            cwd=ROOT,
            env=clean_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    try:
        assert process.stdout is not None
        banner = ""
        while "Ctrl-C to stop" not in banner:
            banner += await read_line(process.stdout)
        assert f"http://127.0.0.1:{api_port}" in banner
        await until(lambda: answers(f"http://127.0.0.1:{api_port}/healthz"), what="the API")
        # No --api-url, no DISCOVERY_URL: the data dir says where the API is, as it says what
        # the NATS credentials are.
        listed = await cli(
            "lease", "list", "--holder", "nobody", DATA_DIR=str(data), DISCOVERY_URL=None
        )
        assert listed.exit_code == 0, listed.output
        assert "no active lease for nobody" in listed.stdout
        # An explicit URL still wins over the data dir.
        with_flag = await cli(
            "lease", "list", "--holder", "nobody", "--api-url", f"http://127.0.0.1:{free_port()}",
            DATA_DIR=str(data), DISCOVERY_URL=None,
        )  # fmt: skip
        assert with_flag.exit_code == 3, with_flag.output
        assert (data / API_FILE).is_file()

        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        # A stopped `up` announces nothing: a later command does not try its port.
        assert not (data / API_FILE).exists()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@pytest.fixture
def left_running(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two processes as a local provider leaves its proxies under DATA_DIR/local/instances:
    each the leader of its group, its pid in the instance's pid file, its command line naming
    its instance directory; and a stranger whose pid file names a process of someone else."""
    started = []
    for name in ("a", "b"):
        instance = tmp_path / "data" / "local" / "instances" / name
        instance.mkdir(parents=True)
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", f"{instance}{os.sep}squid.conf"],
            start_new_session=True,
        )
        (instance / PID_FILE).write_text(f"{child.pid}\n")
        started.append(child)
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    other = tmp_path / "data" / "local" / "instances" / "c"
    other.mkdir()
    (other / PID_FILE).write_text(f"{stranger.pid}\n")
    started.append(stranger)
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


async def test_local_stop_stops_what_up_left_and_refuses_while_up_runs(
    tmp_path: Path, left_running: list[subprocess.Popen[bytes]]
) -> None:
    data = tmp_path / "data"
    *proxies, stranger = left_running
    with exclusive(data.resolve()):  # as a running `up` holds it
        refused = await cli("local", "stop", "--data-dir", str(data))
    assert refused.exit_code == 2, refused.output
    assert "delete --all" in refused.output
    assert all(alive(child.pid) for child in left_running)

    stopped = await cli("local", "stop", "--data-dir", str(data))
    assert stopped.exit_code == 0, stopped.output
    assert "stopped the local proxy local/a" in stopped.stdout
    assert "2 local proxies stopped" in stopped.stdout
    for child in proxies:
        child.wait(timeout=15)  # gone, not only signalled: local stop waits for that
        assert not alive(child.pid)
    assert alive(stranger.pid)  # its pid file named it, its command line did not

    again = await cli("local", "stop", "--data-dir", str(data))
    assert "0 local proxies stopped" in again.stdout
