"""The README, run as written: its "Using it" block against `make demo`'s `up`, offline.

The block is taken from README.md itself, so the README cannot drift from the product: a new user
pastes exactly this into a second terminal while `make demo` runs in the first, from the same
directory, with the defaults (`up` without flags; the CLI without flags).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.system import ROOT, base_env, processes_mentioning

pytestmark = pytest.mark.e2e

DEFAULT_PORTS = (4222, 8080, 8000)
"""NATS, the discovery API and the gateway, where `up` without flags listens."""


def readme_block(heading: str) -> str:
    """The first ```sh block under ``heading`` in README.md."""
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found, f"no sh block under '## {heading}' in README.md"
    return found.group(1)


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers bind: connections of an earlier run in TIME_WAIT do not block them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_setup_commands_are_the_ones_ci_runs() -> None:
    setup = readme_block("Set-up (fresh Debian/Ubuntu machine)")
    lines = [line for line in setup.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "sh deploy/host-packages.sh demo && make demo",
        "sh deploy/host-packages.sh test && make test",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "sh deploy/host-packages.sh test" in ci
    assert "\nmake test\n" in ci


async def test_the_using_it_block_runs_as_written(tmp_path: Path) -> None:
    busy = [port for port in DEFAULT_PORTS if not port_free(port)]
    assert not busy, f"the README uses the default ports; {busy} are taken on this machine"
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    env = base_env()
    env.pop("HEALTH_CHECK_URL", None)  # the demo's own default: offline, out of the box
    up = await asyncio.create_subprocess_exec(
        str(ROOT / ".venv" / "bin" / "egress-proxies"),
        "up",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = b""
    try:
        assert up.stdout is not None
        async with asyncio.timeout(60):
            while b"Ctrl-C" not in output:
                line = await up.stdout.readline()
                assert line, f"up exited early:\n{output.decode()}"
                output += line
        script = "set -euo pipefail\n" + readme_block("Using it")
        used = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert used.returncode == 0, f"{used.stdout}\n{used.stderr}"
        assert "created" in used.stdout
        assert '"status":"ok"' in used.stdout.replace(" ", "")  # curl through the leased proxy
        assert "407\n" in used.stdout  # and refused without the lease's credentials (D84)
        assert "ProxyDeclared" in used.stdout  # the events of the proxy
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                rest, _ = await up.communicate()
                output += rest or b""
    assert up.returncode == 0, output.decode()[-3000:]
    assert b"Traceback" not in output
    assert b"egress-proxies up stopped: no local proxies keep running" in output
    instances = (tmp_path / ".data" / "local" / "instances").resolve()
    assert processes_mentioning(str(instances)) == [], "the block deletes what it made"


def test_make_clean_stops_the_local_proxies_it_would_orphan(tmp_path: Path) -> None:
    """Local proxies outlive `up`; removing .data under them would leave them unmanaged."""
    instance = tmp_path / ".data" / "local" / "instances" / "px-1"
    instance.mkdir(parents=True)
    stray = subprocess.Popen(  # a process that, like Squid, names its instance dir
        [sys.executable, "-c", "import time; time.sleep(300)", str(instance.resolve())],
        start_new_session=True,
    )
    try:
        (instance / "proxy.pid").write_text(f"{stray.pid}\n")
        (tmp_path / "Makefile").write_text((ROOT / "Makefile").read_text())
        cleaned = subprocess.run(
            ["make", "clean", "VENV=.venv-none"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ},
        )
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert f"pid {stray.pid}" in cleaned.stdout
        assert stray.wait(timeout=10) == -signal.SIGTERM
        assert not (tmp_path / ".data").exists()
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()
