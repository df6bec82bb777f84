"""One hypervisor's libvirt, reached over SSH: the only place this provider does network I/O.

The hypervisor needs no libvirtd TCP/TLS listener: asyncssh forwards a unix socket in a private
temporary directory to libvirtd's unix socket on the host, and libvirt-python connects to that
local socket. libvirt calls block, so they run in a thread pool of the host's own (a hung host
cannot starve the others), and every call is bounded by the caller's deadline. Python cannot
interrupt a thread, so when a deadline passes (or the caller is cancelled) the SSH connection under
the call is closed: libvirt then reads end-of-file on its socket and the thread returns with an
error instead of hanging on forever.

One link per host is cached and shared; concurrent callers share one dial. A transport failure
(SSH gone, keepalive missed, libvirt's connection dead) drops the link and the next call redials;
an error the daemon reports (no such domain, bad XML) leaves the link in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import structlog

from services.providers.base import ProviderError, Transient
from services.providers.kvm.pure.classify import classify_libvirt
from services.providers.kvm.pure.config import HostConfig

log = structlog.get_logger("egress.provider.kvm")


def wrap_libvirt(exc: libvirt.libvirtError, what: str) -> ProviderError:
    """The taxonomy error for ``exc`` saying what was being done; the caller raises it
    ``from exc`` so the original stays in the logs."""
    code = exc.get_error_code() or 0
    message = exc.get_error_message() or str(exc)
    cls = classify_libvirt(code, message)
    log.debug(
        "libvirt error",
        what=what,
        code=code,
        domain=exc.get_error_domain(),
        level=exc.get_error_level(),
        message=message,
        result=cls.__name__,
    )
    return cls(f"{what}: {message}")


T = TypeVar("T")
# SSH keepalives: a link that misses this many answers in a row is closed, so a dead hypervisor
# is noticed within two intervals even while no libvirt call is running.
KEEPALIVE_COUNT_MAX = 2
# After the connection under a timed-out call is closed, how long to wait for its thread.
_RELEASE_GRACE = 5.0
# Error codes that mean the connection to the daemon is gone (not a refusal by the daemon).
_TRANSPORT_CODES = frozenset(
    {
        libvirt.VIR_ERR_RPC,
        libvirt.VIR_ERR_NO_CONNECT,
        libvirt.VIR_ERR_INVALID_CONN,
    }
)


def _quiet(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr unless a handler is set; ours are raised instead."""


libvirt.registerErrorHandler(_quiet, None)


class SshCredentials:
    """The client key and trusted host keys, read once at start-up (a missing file is a config
    error then, not a failed proxy later)."""

    def __init__(
        self,
        client_key: asyncssh.SSHKey,
        known_hosts: asyncssh.SSHKnownHosts | None,
    ) -> None:
        self.client_key = client_key
        self.known_hosts = known_hosts


class _Busy:
    """Threads running a libvirt call for one host, across its links."""

    threads = 0


class HostLink:
    """A live SSH connection with its socket forward and the libvirt connection on top."""

    def __init__(
        self,
        host: HostConfig,
        ssh: asyncssh.SSHClientConnection,
        pool: ThreadPoolExecutor,
        workdir: Path,
        busy: _Busy,
    ) -> None:
        self.host = host
        self.ssh = ssh
        self.virt: libvirt.virConnect | None = None
        self.broken = False
        self._pool = pool
        self._workdir = workdir
        self._listener: asyncssh.SSHListener | None = None
        self._inflight = 0
        self._busy = busy
        self._watch: asyncio.Future[None] | None = None

    @property
    def socket_path(self) -> Path:
        return self._workdir / "libvirt.sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket_path}"

    async def forward(self) -> None:
        self._listener = await self.ssh.forward_local_path(str(self.socket_path), self.host.socket)

    def watch(self) -> None:
        """Notice a link that dies between calls (keepalive missed, host rebooted)."""
        self._watch = asyncio.ensure_future(self.ssh.wait_closed())
        self._watch.add_done_callback(lambda _: self.close("the SSH connection closed"))

    async def run(self, fn: Callable[[libvirt.virConnect], T], what: str, deadline: float) -> T:
        """``fn(connection)`` in a thread, bounded by ``deadline`` (loop time). Errors come back
        classified; a transport failure breaks this link so the next call redials."""
        virt = self.virt
        if self.broken or virt is None:
            raise Transient(f"{self.host.name}: {what}: the connection to the host was lost")
        return await self._bounded(lambda: fn(virt), what, deadline)

    async def _bounded(self, call: Callable[[], T], what: str, deadline: float) -> T:
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise Transient(f"{self.host.name}: {what}: the deadline passed before the call")
        future = loop.run_in_executor(self._pool, call)
        self._inflight += 1
        self._busy.threads += 1
        future.add_done_callback(self._call_done)
        try:
            done, _ = await asyncio.wait({future}, timeout=remaining)
        except asyncio.CancelledError:
            self.close("the caller gave up")
            raise
        if not done:
            self.close(f"{what} did not answer within {remaining:.1f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait({future}, timeout=_RELEASE_GRACE)
            raise Transient(
                f"{self.host.name}: {what}: no answer within {remaining:.1f}s; "
                "closed the connection and will reconnect"
            )
        try:
            return future.result()
        except libvirt.libvirtError as exc:
            if self._is_transport_failure(exc):
                self.close(f"{what}: {exc}")
                raise Transient(
                    f"{self.host.name}: {what}: lost the connection to libvirtd ({exc})"
                ) from exc
            raise wrap_libvirt(exc, f"{self.host.name}: {what}") from exc
        except ProviderError:
            raise
        except Exception as exc:
            # Not libvirt's: a stream that refused data, an answer we could not read. Retrying
            # is all a caller can do, and the contract wants every error classified.
            raise Transient(f"{self.host.name}: {what}: {exc!r}") from exc

    def _is_transport_failure(self, exc: libvirt.libvirtError) -> bool:
        if self.broken or self.ssh.is_closed():
            return True
        if exc.get_error_code() in _TRANSPORT_CODES:
            return True
        if exc.get_error_domain() == libvirt.VIR_FROM_RPC:
            return True
        try:
            return self.virt is not None and self.virt.isAlive() != 1
        except libvirt.libvirtError:
            return True

    def close(self, reason: str) -> None:
        """Close everything under this link; blocked calls on it return with an error."""
        if self.broken:
            return
        self.broken = True
        log.info("kvm link closed", host=self.host.name, reason=reason)
        if self._listener is not None:
            self._listener.close()
        self.ssh.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        self._release()

    def _call_done(self, future: asyncio.Future[Any]) -> None:
        # A call abandoned by its caller still completes in its thread; read its outcome so
        # asyncio does not report an exception nobody retrieved.
        if not future.cancelled():
            future.exception()
        self._inflight -= 1
        self._busy.threads -= 1
        if self.broken:
            self._release()

    def _release(self) -> None:
        """Close libvirt's connection once no thread uses it: closing it under a running call
        could free what that call still reads. The call itself returns once SSH is gone."""
        virt = self.virt
        if virt is None or self._inflight:
            return
        self.virt = None
        with contextlib.suppress(RuntimeError):  # the pool is already shut down
            self._pool.submit(_close_quietly, virt)


def _close_quietly(virt: libvirt.virConnect) -> None:
    with contextlib.suppress(libvirt.libvirtError):
        virt.close()


class HostTransport:
    """The cached link to one host; see the module docstring."""

    def __init__(
        self,
        host: HostConfig,
        credentials: SshCredentials,
        *,
        connect_timeout: float,
        keepalive_interval: float,
        max_threads: int = 8,
    ) -> None:
        self.host = host
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self._keepalive_interval = keepalive_interval
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix=f"kvm-{host.name}")
        self._link: HostLink | None = None
        self._dialing: asyncio.Task[HostLink] | None = None
        self._closed = False
        self._busy = _Busy()

    @property
    def calls_in_flight(self) -> int:
        """Threads still inside a libvirt call, abandoned ones included: a call released by its
        deadline ends here once the connection under it is closed."""
        return self._busy.threads

    @property
    def connected(self) -> bool:
        """Whether a live link is cached (for diagnostics and tests; calls never need it)."""
        return self._link is not None and not self._link.broken

    async def link(self, deadline: float) -> HostLink:
        """The live link, dialing it if needed; concurrent callers share one dial."""
        if self._closed:
            raise Transient(f"{self.host.name}: the provider is closed")
        if self._link is not None and not self._link.broken:
            return self._link
        if self._dialing is None:
            self._dialing = asyncio.create_task(self._dial(), name=f"kvm-dial-{self.host.name}")
            self._dialing.add_done_callback(self._dialed)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(self._dialing)
        except TimeoutError as exc:
            raise Transient(
                f"{self.host.name}: not connected to {self.host.address} before the deadline"
            ) from exc

    async def run(self, fn: Callable[[libvirt.virConnect], T], what: str, deadline: float) -> T:
        link = await self.link(deadline)
        return await link.run(fn, what, deadline)

    def _dialed(self, task: asyncio.Task[HostLink]) -> None:
        self._dialing = None
        if task.cancelled() or task.exception() is not None:
            return
        link = task.result()
        if self._closed:
            link.close("the provider closed while dialing")
        else:
            self._link = link

    async def _dial(self) -> HostLink:
        host = self.host
        where = f"{host.name}: ssh {host.user}@{host.address}"
        try:
            ssh = await asyncssh.connect(
                host.hostname,
                host.port,
                username=host.user,
                client_keys=[self._credentials.client_key],
                known_hosts=self._credentials.known_hosts,
                connect_timeout=self._connect_timeout,
                keepalive_interval=self._keepalive_interval,
                keepalive_count_max=KEEPALIVE_COUNT_MAX,
                config=[],
                agent_path=None,
                preferred_auth="publickey",
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise Transient(
                f"{where}: the host key is not trusted ({exc.reason}); add the host's current "
                "key to knownHostsFile (ssh-keyscan), after checking it is really that host"
            ) from exc
        except asyncssh.PermissionDenied as exc:
            raise Transient(
                f"{where}: the host refused our key ({exc.reason}); add the public half of "
                "sshKeyFile to the user's ~/.ssh/authorized_keys on the host"
            ) from exc
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            reason = getattr(exc, "reason", "") or str(exc) or type(exc).__name__
            raise Transient(f"{where}: cannot connect ({reason})") from exc
        workdir = Path(tempfile.mkdtemp(prefix="egress-kvm-"))
        link = HostLink(host, ssh, self._pool, workdir, self._busy)
        try:
            await link.forward()
            loop = asyncio.get_running_loop()
            link.virt = await link._bounded(
                lambda: libvirt.open(link.uri),
                "open libvirt over the forwarded socket",
                loop.time() + self._connect_timeout,
            )
        except (OSError, asyncssh.Error) as exc:
            link.close(f"forward failed: {exc}")
            raise Transient(f"{where}: cannot forward {host.socket} ({exc})") from exc
        except ProviderError as exc:
            link.close(f"libvirt open failed: {exc}")
            raise Transient(
                f"{where}: cannot open libvirt on {host.socket} ({exc}); is libvirtd running "
                f"there and is {host.user} in group libvirt?"
            ) from exc
        except BaseException:
            link.close("dial abandoned")
            raise
        link.watch()
        log.info("kvm link up", host=host.name, address=host.address)
        return link

    async def close(self) -> None:
        self._closed = True
        if self._dialing is not None:
            self._dialing.cancel()
            with contextlib.suppress(BaseException):
                await self._dialing
        if self._link is not None:
            self._link.close("the provider closed")
            await self._link.ssh.wait_closed()
        self._pool.shutdown(wait=False)
