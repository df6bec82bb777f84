"""The whole system as a user runs it: `egress-proxies up` and CLI commands as subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.providers.local_process import PID_FILE
from services.runtime.ports import free_port
from tests.support.httpthread import serving

ROOT = Path(__file__).resolve().parents[2]


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello through the proxy"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@contextmanager
def hello_target() -> Iterator[str]:
    """A loopback origin the health prober and the tests fetch through the proxies."""
    with serving(Hello) as url:
        yield f"{url}/"


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (a local proxy names its instance
    directory), zombies aside."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker in cmdline and "\nState:\tZ" not in status:
            found.append(int(entry.name))
    return found


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_URL", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def fetch_via(proxy_url: str, url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    with opener.open(url, timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


@dataclass
class Up:
    process: asyncio.subprocess.Process
    env: dict[str, str]
    """For CLI commands against this system."""
    api: str
    data_dir: Path
    output: bytearray
    gateway_port: int = 0
    """Where its gateway listens (docs/gateway.md); 0 when the test chose none."""

    async def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(cli, *args, env=self.env, timeout=timeout)

    async def proxies(self) -> list[dict[str, Any]]:
        got = await self.cli("get", "-o", "json")
        assert got.returncode == 0, got.stdout + got.stderr
        items: list[dict[str, Any]] = json.loads(got.stdout)["items"]
        return items

    async def api_call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        def call() -> tuple[int, dict[str, Any]]:
            data = json.dumps(body).encode() if body is not None else None
            request = urllib.request.Request(
                self.api + path,
                data=data,
                method=method,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    raw = response.read()
                    return response.status, json.loads(raw) if raw else {}
            except urllib.error.HTTPError as exc:
                with exc:  # it holds the response's socket until closed
                    raw = exc.read()
                return exc.code, json.loads(raw) if raw else {}

        return await asyncio.to_thread(call)

    def squid_pid(self, provider_id: str) -> int:
        meta = self.data_dir / "local" / "instances" / provider_id / "meta.json"
        pid = int(json.loads(meta.read_text())["pid"])
        pid_file = meta.parent / PID_FILE
        if pid_file.is_file() and pid_file.read_text().strip().isdigit():
            pid = int(pid_file.read_text().strip())
        return pid


@asynccontextmanager
async def running_up(
    tmp_path: Path,
    *extra: str,
    nats_url: str = "",
    health_check_url: str = "",
    up_env: Mapping[str, str] | None = None,
    local_dirs: Sequence[Path] = (),
) -> AsyncIterator[Up]:
    """`up` with its own data dir and ports (its gateway's too, so parallel tests never meet on
    8000); stopped with SIGINT, which must end it with 0.
    ``up_env`` adds variables for `up` alone (e.g. ``OTEL_*``), not for the CLI commands;
    ``local_dirs`` are the ``dataDir`` of local providers a ``--providers-config`` names, whose
    proxies are stopped at the end too."""
    data_dir = tmp_path / "data"
    api_port, gateway_port = free_port(), free_port()
    env = base_env()
    args = ["--data-dir", str(data_dir), "--metrics-port", "0", "--api-port", str(api_port)]
    args += ["--gateway-port", str(gateway_port)]
    if nats_url:
        args += ["--nats-url", nats_url]
        url = nats_url
    else:
        nats_port = free_port()
        args += ["--nats-port", str(nats_port)]
        url = f"nats://127.0.0.1:{nats_port}"
    if health_check_url:
        args += ["--health-check-url", health_check_url]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli.main",
        "up",
        *args,
        *extra,
        env={**env, **(up_env or {})},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    up = Up(
        process,
        {**env, "NATS_URL": url},
        f"http://127.0.0.1:{api_port}",
        data_dir,
        bytearray(),
        gateway_port,
    )
    try:
        async with supervised(up):
            yield up
    finally:
        stop_local_proxies(data_dir, *local_dirs)


@asynccontextmanager
async def supervised(up: Up) -> AsyncIterator[Up]:
    """An `up` process from its banner ("Ctrl-C") on, its output kept in ``up.output``; stopped
    with SIGINT, which must end it with 0."""
    process, output = up.process, up.output
    assert process.stdout is not None
    pump: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(60):
            while b"Ctrl-C" not in output:
                line = await process.stdout.readline()
                assert line, f"up exited early:\n{output.decode()}"
                output += line
        pump = asyncio.create_task(_pump(process.stdout, output))
        yield up
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                await process.wait()
        if pump is not None:
            await pump
    assert process.returncode == 0, output.decode()[-4000:]


def stop_local_proxies(data_dir: Path, *local_dirs: Path) -> None:
    """Local proxies outlive `up` on purpose (the next `up` adopts them); a test's must not
    outlive the test. ``data_dir`` is `up`'s (its default local provider keeps its proxies in
    ``local/``), ``local_dirs`` the ``dataDir`` of other local providers. The check of the
    command line is `make clean`'s: a pid reused by another process is left alone. The whole
    process group goes (the proxy leads one, docs/decisions/0145-parallel-tests.md): Squid's lease
    helpers with it."""
    folders = [data_dir / "local" / "instances", *(folder / "instances" for folder in local_dirs)]
    for pid_file in (found for folder in folders for found in folder.glob(f"*/{PID_FILE}")):
        try:
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if str(pid_file.parent.resolve()).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)


async def _pump(stream: asyncio.StreamReader, into: bytearray) -> None:
    """Keep reading `up`'s output, so it never blocks on a full pipe."""
    while line := await stream.readline():
        into += line
