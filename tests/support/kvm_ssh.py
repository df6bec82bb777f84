"""A stand-in hypervisor's SSH side: a real asyncssh server that accepts one client key, has a
host key the client's known_hosts names, and forwards the unix-socket connections the provider
opens to the private libvirtd's socket, as OpenSSH's sshd does for ``ssh -L path:path``.

The relay is ours rather than asyncssh's built-in forwarding so a test can pause it: a paused
hypervisor swallows every byte in both directions, which is exactly a host that accepted the
connection and then stopped answering.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path

import asyncssh


@dataclass(frozen=True)
class SshKeys:
    """The provider's key files and the keys the servers present and accept."""

    client_key_file: Path
    client_key: asyncssh.SSHKey
    host_key: asyncssh.SSHKey

    @staticmethod
    def create(directory: Path) -> SshKeys:
        directory.mkdir(parents=True, exist_ok=True)
        client = asyncssh.generate_private_key("ssh-ed25519")
        path = directory / "id_ed25519"
        client.write_private_key(str(path))
        path.chmod(0o600)
        return SshKeys(path, client, asyncssh.generate_private_key("ssh-ed25519"))


def known_hosts_line(port: int, key: asyncssh.SSHKey) -> str:
    public = key.export_public_key().decode().strip()
    return f"[127.0.0.1]:{port} {public}\n"


class _Relay(asyncssh.SSHUNIXSession[bytes]):
    def __init__(
        self,
        hypervisor: Hypervisor,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self._hypervisor = hypervisor
        self._reader = reader
        self._writer = writer
        self._chan: asyncssh.SSHUNIXChannel[bytes] | None = None
        self._pump: asyncio.Task[None] | None = None

    def connection_made(self, chan: asyncssh.SSHUNIXChannel[bytes]) -> None:
        self._chan = chan

    def session_started(self) -> None:
        self._pump = asyncio.create_task(self._from_daemon())

    async def _from_daemon(self) -> None:
        assert self._chan is not None
        with contextlib.suppress(OSError, asyncssh.Error):
            while data := await self._reader.read(65536):
                if not self._hypervisor.paused:
                    self._chan.write(data)
            self._chan.write_eof()

    def data_received(self, data: bytes, datatype: int | None) -> None:
        if not self._hypervisor.paused:
            self._writer.write(data)

    def eof_received(self) -> bool:
        with contextlib.suppress(OSError):
            self._writer.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._writer.close()
        if self._pump is not None:
            self._pump.cancel()


class _Server(asyncssh.SSHServer):
    def __init__(self, hypervisor: Hypervisor) -> None:
        self._hypervisor = hypervisor
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._hypervisor.connections.append(conn)

    def unix_connection_requested(self, dest_path: str) -> Awaitable[_Relay]:
        if dest_path != str(self._hypervisor.daemon_socket):
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, f"no socket at {dest_path}"
            )
        return self._hypervisor.open_relay()


class Hypervisor:
    """One "host": an SSH server on 127.0.0.1 in front of a libvirtd socket."""

    def __init__(
        self,
        daemon_socket: Path,
        keys: SshKeys,
        *,
        accepted_key: asyncssh.SSHKey | None = None,
    ) -> None:
        self.daemon_socket = daemon_socket
        self.keys = keys
        accepted = accepted_key or keys.client_key
        self._authorized = asyncssh.import_authorized_keys(accepted.export_public_key().decode())
        self.paused = False
        self.connections: list[asyncssh.SSHServerConnection] = []
        self._server: asyncssh.SSHAcceptor | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Hypervisor:
        self._server = await asyncssh.create_server(
            lambda: _Server(self),
            "127.0.0.1",
            0,
            server_host_keys=[self.keys.host_key],
            authorized_client_keys=self._authorized,
            allow_scp=False,
            keepalive_interval=0,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def open_relay(self) -> _Relay:
        reader, writer = await asyncio.open_unix_connection(str(self.daemon_socket))
        return _Relay(self, reader, writer)

    def known_hosts(self, key: asyncssh.SSHKey | None = None) -> str:
        return known_hosts_line(self.port, key or self.keys.host_key)

    def drop_connections(self) -> None:
        for conn in self.connections:
            conn.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for conn in self.connections:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()


@contextlib.asynccontextmanager
async def hypervisor(
    daemon_socket: Path, keys: SshKeys, **kwargs: asyncssh.SSHKey | None
) -> AsyncIterator[Hypervisor]:
    host = await Hypervisor(daemon_socket, keys, **kwargs).start()
    try:
        yield host
    finally:
        await host.close()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never says a word (not even an SSH banner)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


class FreezableProxy:
    """A TCP proxy in front of a hypervisor's SSH port that can freeze: bytes stop flowing both
    ways while every socket stays open, like a host that hung or a cable pulled mid-way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen = False
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> FreezableProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if not self.frozen:
                    sink.write(data)
                    await sink.drain()
        sink.close()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
