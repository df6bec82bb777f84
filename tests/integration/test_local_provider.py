"""The local provider with real proxy processes: the contract on both backends, real HTTP and
CONNECT traffic through it, restarts of the executor, and processes dying behind its back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import trustme

from events.schemas import InstanceState
from services.providers import local_process
from services.providers.base import NotFound, Permanent
from services.providers.local import LocalProvider
from services.providers.pure.targets import AllowedTarget
from tests.contract.provider import (
    MakeRequest,
    ProviderContract,
    Provoke,
    delete_all,
    request_factory,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration

BACKENDS = ["squid", "proxypy"]
GRACE = 0.5  # squid's clean shutdown takes seconds; tests need not wait for it
WAIT = 30.0


def our_processes(instance_dir: Path) -> list[int]:
    """Live processes started for ``instance_dir``, found independently of the provider."""
    marker = (str(instance_dir) + os.sep).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and stat.rpartition(")")[2].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def shm_segments() -> set[str]:
    return {path.name for path in Path("/dev/shm").iterdir()}


# ----------------------------------------------------------------------------- contract


class LocalContract(ProviderContract):
    ready_timeout = WAIT
    backend: ClassVar[str]

    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[LocalProvider]:
        provider = LocalProvider(
            "local", tmp_path / "local", backend=self.backend, stop_grace=GRACE
        )
        yield provider
        await delete_all(provider)
        await provider.close()

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("local")

    @pytest.fixture
    def provoke(
        self, provider: LocalProvider, make_request: MakeRequest, tmp_path: Path
    ) -> Iterator[Provoke]:
        corrupt = provider.data_dir / "instances" / "corrupt"
        corrupt.mkdir(parents=True)
        (corrupt / "meta.json").write_text("{not json")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            full = LocalProvider(
                "full", tmp_path / "full", backend=self.backend, port_range=(port, port)
            )
            yield [
                ("a name that is a path", lambda: provider.create(make_request("../escape"))),
                ("no free port", lambda: full.create(make_request("q1"))),
                ("a corrupt record", lambda: provider.get("corrupt")),
            ]


class TestSquidContract(LocalContract):
    backend = "squid"


class TestProxypyContract(LocalContract):
    backend = "proxypy"


# ----------------------------------------------------------------------------- traffic


LOOPBACK_TLS = AllowedTarget(cidr="127.0.0.1/32", ports=("1024-65535",))


@pytest.fixture(params=BACKENDS)
async def local(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalProvider]:
    # The TLS servers here listen on random loopback ports: allowed explicitly, as an operator
    # would for an intranet crawl; CONNECT goes nowhere else (D134).
    provider = LocalProvider(
        "local",
        tmp_path / "local",
        backend=request.param,
        stop_grace=GRACE,
        targets=(LOOPBACK_TLS,),
    )
    yield provider
    await delete_all(provider)


@pytest.fixture
def make_request() -> MakeRequest:
    return request_factory("local")


async def running_port(provider: LocalProvider, provider_id: str) -> int:
    async def is_running() -> bool:
        return (await provider.get(provider_id)).state is InstanceState.RUNNING

    await until(is_running, WAIT, what="Running")
    return (await provider.get(provider_id)).port


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A one-shot HTTP server that echoes the request line, so the test sees what arrived."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        body = b"reached " + head.split(b"\r\n")[0]
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head.split(b"\r\n")[0], await reader.readexactly(length)


async def test_http_request_through_the_proxy(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    port = await running_port(local, await local.create(make_request("web")))
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        url = f"http://127.0.0.1:{target}/page?q=1"
        writer.write(f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n\r\n".encode())
        status, body = await asyncio.wait_for(read_response(reader), WAIT)
        writer.close()
        await writer.wait_closed()
    assert status.startswith(b"HTTP/1.1 200")
    # The server got an origin-form request: the proxy forwarded it, not just echoed ours.
    assert body == b"reached GET /page?q=1 HTTP/1.1"


async def test_connect_tunnel_reaches_a_tls_server_on_any_port(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    port = await running_port(local, await local.create(make_request("tls")))
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    target = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nHost: 127.0.0.1:{target}\r\n\r\n".encode()
        )
        established = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert established.split(b" ")[1] == b"200", established
        await writer.start_tls(client_ctx, server_hostname="localhost")
        writer.write(b"GET /secret HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, body = await asyncio.wait_for(read_response(reader), WAIT)
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    assert status.startswith(b"HTTP/1.1 200")
    assert body == b"reached GET /secret HTTP/1.1"


# ----------------------------------------------------------------------------- lifecycle


async def test_meta_record_and_a_second_provider_on_the_same_dir(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    request = make_request("shared", owner_uid="owner-s")
    provider_id = await local.create(request)
    port = await running_port(local, provider_id)
    instance_dir = local.data_dir / "instances" / provider_id
    meta = json.loads((instance_dir / "meta.json").read_text())
    assert meta["name"] == provider_id
    assert meta["ownerUid"] == "owner-s"
    assert (meta["port"], meta["backend"], meta["specHash"]) == (port, local.backend, "h1")
    assert meta["pid"] in our_processes(instance_dir)
    assert meta["createdAt"].endswith("Z")

    restarted = LocalProvider("local", local.data_dir, backend=local.backend, stop_grace=GRACE)
    seen = await restarted.get(provider_id)
    assert seen == await local.get(provider_id)
    assert [i.provider_id for i in await restarted.list_by_tag()] == [provider_id]
    await restarted.delete(provider_id)
    with pytest.raises(NotFound):
        await local.get(provider_id)
    assert our_processes(instance_dir) == []
    assert not instance_dir.exists()


async def test_instances_outlive_the_process_that_created_them(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from services.providers.local import LocalProvider
        from tests.contract.provider import request_factory

        provider = LocalProvider("local", Path({str(local.data_dir)!r}), backend={local.backend!r})
        asyncio.run(provider.create(request_factory("local")("detached")))
        """
    )
    creator = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    assert await asyncio.wait_for(creator.wait(), WAIT) == 0
    await running_port(local, "detached")
    instance_dir = local.data_dir / "instances" / "detached"
    assert our_processes(instance_dir)
    await local.delete("detached")
    assert our_processes(instance_dir) == []


async def test_killed_proxy_is_stopped_and_delete_leaves_no_process(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    provider_id = await local.create(make_request("victim"))
    await running_port(local, provider_id)
    instance_dir = local.data_dir / "instances" / provider_id
    pid = json.loads((instance_dir / "meta.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)

    async def stopped() -> bool:
        return (await local.get(provider_id)).state is InstanceState.STOPPED

    await until(stopped, WAIT, what="Stopped")
    assert (await local.get(provider_id)).url == ""
    await local.delete(provider_id)
    assert our_processes(instance_dir) == []
    with pytest.raises(NotFound):
        await local.get(provider_id)


async def test_delete_stops_a_running_proxy_without_leftovers(
    local: LocalProvider, make_request: MakeRequest
) -> None:
    before = shm_segments()
    provider_id = await local.create(make_request("busy"))
    port = await running_port(local, provider_id)
    instance_dir = local.data_dir / "instances" / provider_id
    # Only this instance's segments are the test's: a Squid of an earlier test still starting
    # or stopping on the machine may add its own meanwhile.
    ours = local_process.squid_service(instance_dir)
    assert our_processes(instance_dir)
    if local.backend == "squid":
        # Squid keeps shared memory outside the instance dir, under a name of its own.
        segments = shm_segments() - before
        assert {name for name in segments if name.startswith(ours)}
        assert not any(name.startswith("squid-") for name in segments)
    await local.delete(provider_id)
    assert our_processes(instance_dir) == []
    assert not await local_process.accepts(port)
    assert {name for name in shm_segments() if name.startswith(ours)} == set()


async def test_a_crash_between_record_and_spawn_is_visible_and_recoverable(
    tmp_path: Path, make_request: MakeRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = LocalProvider("local", tmp_path / "local", backend="squid", stop_grace=GRACE)

    def crash(command: list[str], instance_dir: Path) -> int:
        raise RuntimeError("executor died here")

    with monkeypatch.context() as patch:
        patch.setattr(local_process, "spawn", crash)
        with pytest.raises(RuntimeError, match="died here"):
            await provider.create(make_request("half"))
    # Recorded, so GC and the reconciler can see it; Pending while a create may be in flight.
    assert [(i.name, i.state) for i in await provider.list_by_tag()] == [
        ("half", InstanceState.PENDING)
    ]
    impatient = LocalProvider("local", provider.data_dir, backend="squid", start_grace=0.0)
    assert (await impatient.get("half")).state is InstanceState.STOPPED
    # A repeated create (the redelivered command) finishes the job.
    assert await provider.create(make_request("half")) == "half"
    await running_port(provider, "half")
    await delete_all(provider)


async def test_a_name_that_is_a_path_is_refused_and_never_found(
    tmp_path: Path, make_request: MakeRequest
) -> None:
    provider = LocalProvider("local", tmp_path / "local", backend="squid")
    for name in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(Permanent, match="not usable as a directory name"):
            await provider.create(make_request(name))
        with pytest.raises(NotFound):
            await provider.get(name)
        await provider.delete(name)
    assert not (tmp_path / "x").exists()
