"""Processes behind the local provider: which proxy to run, how to start, probe and stop it.

Kept apart from the provider so the operating-system details (process groups, pid files, zombies,
privilege drop) sit in one place, and the provider reads as the contract it implements.

Why the pid file is written by the child: the provider records an instance before spawning it, but
a crash between ``posix_spawn`` returning and the pid reaching ``meta.json`` would otherwise leave
a process nobody knows about. A tiny shell prologue writes its own pid (``exec`` keeps it) with
``noclobber``, so the file exists as soon as the process does, and a second spawn for the same
instance (a retry racing a crash) cannot overwrite it and exits instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import importlib.util
import os
import pwd
import random
import shutil
import signal
import socket
import sys
from collections.abc import Collection
from pathlib import Path

from services.providers import local_auth
from services.providers.base import LeaseAuth, Permanent, ProviderError, QuotaExceeded, Transient
from services.providers.pure.squidconf import Parent, SquidAuth
from services.providers.pure.squidconf import squid_config as shared_squid_config
from services.providers.pure.targets import AllowedTarget
from services.providers.squidauth.secret import SECRET_ENV

SQUID = "squid"
PROXYPY = "proxypy"
BACKENDS = ("auto", SQUID, PROXYPY)
HOST = "127.0.0.1"
PID_FILE = "proxy.pid"
LOG_FILE = "proxy.log"
ACCESS_LOG = "access.log"
"""A metered instance's access log (docs/decisions/0161-metering-upstream-bytes.md)."""
# Exit status of the prologue when another process already owns the instance's pid file.
PIDFILE_TAKEN = 97
_PROLOGUE = f'set -C; echo $$ > "$0" || exit {PIDFILE_TAKEN}; exec "$@"'


def resolve_backend(wanted: str) -> str:
    """Squid when it is installed (what every other provider runs), else proxy.py, so a laptop
    without Squid still gets a working proxy. Raises ValueError naming the fix."""
    has_squid = shutil.which(SQUID) is not None
    has_proxypy = importlib.util.find_spec("proxy") is not None
    if wanted == SQUID and not has_squid:
        raise ValueError("backend squid: `squid` is not on PATH; install it or use backend auto")
    if wanted == PROXYPY and not has_proxypy:
        raise ValueError("backend proxypy: install the proxy.py package or use backend squid")
    if wanted in (SQUID, PROXYPY):
        return wanted
    if has_squid:
        return SQUID
    if has_proxypy:
        return PROXYPY
    raise ValueError("no proxy to run: install squid, or the proxy.py package")


def _squid_user() -> str:
    """Squid started as root drops to an unprivileged user; we name it so we can hand it the
    instance directory (Debian's build uses ``proxy``)."""
    for user in ("proxy", "squid", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return user
    return "nobody"


def squid_config(
    instance_dir: Path,
    port: int,
    name: str,
    user: str | None,
    auth: SquidAuth | None = None,
    *,
    outgoing: str = "",
    targets: Collection[AllowedTarget] = (),
    parent: Parent | None = None,
    access_log: str = "",
) -> str:
    """The shared egress Squid on loopback, logging into the instance directory, connecting to
    targets from ``outgoing`` when one is given. Plain HTTP to loopback stays allowed: the
    sites a developer tests with run there (D134); ``targets`` adds what else it may reach.
    With ``parent`` every request is chained to it (D160)."""
    return shared_squid_config(
        listen=f"{HOST}:{port}",
        name=name,
        cache_log=str(instance_dir / "cache.log"),
        coredump_dir=str(instance_dir),
        user=user,
        auth=auth,
        outgoing=outgoing,
        targets=tuple(targets),
        loopback_http=True,
        parent=parent,
        access_log=access_log,
    )


def log_dir(instance_dir: Path) -> Path:
    """Where a metered instance's Squid writes its access log: beside its lease helper, in a
    directory Squid's user can reach after Squid drops root (``local_auth.auth_dir``)."""
    user = _squid_user() if os.geteuid() == 0 else None
    return local_auth.auth_dir(instance_dir, user, squid_service(instance_dir))


def unbindable(address: str) -> str:
    """Why a socket cannot use ``address`` (an IP literal) as its source on this host, or ""."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def squid_service(instance_dir: Path) -> str:
    """Squid names its shared-memory segments after its service name (``squid`` by default), so
    instances sharing one would unlink each other's, or fail on another user's leftovers."""
    return "egress" + hashlib.sha256(str(instance_dir).encode()).hexdigest()[:16]


def remove_leftovers(instance_dir: Path) -> None:
    """Shared-memory segments a killed Squid could not remove, and the lease helper's own
    directory when it could not live in the instance directory (``auth_dir``): nothing else is
    outside the instance directory."""
    shm = Path("/dev/shm")
    if shm.is_dir():
        for segment in shm.glob(f"{squid_service(instance_dir)}-*"):
            segment.unlink(missing_ok=True)
    local_auth.remove_own_dir(squid_service(instance_dir))


def prepare(
    backend: str,
    instance_dir: Path,
    port: int,
    name: str,
    *,
    lease_auth: LeaseAuth | None = None,
    outgoing: str = "",
    targets: Collection[AllowedTarget] = (),
    parent: Parent | None = None,
    metered: bool = False,
) -> list[str]:
    """Write what the backend needs into ``instance_dir`` and return its command line. Every
    command line names a file inside ``instance_dir``, which is how a pid is recognised as ours
    later. With ``lease_auth`` the proxy serves only a current lease's holder (D84); with
    ``outgoing`` (Squid only) it connects to targets from that address; with ``parent`` (Squid
    only) it chains every request to that proxy, whose login lives only in the config file,
    readable by Squid's user alone (D160); with ``metered`` (Squid only) it logs every request
    and tunnel with its lease to ``log_dir`` (D161)."""
    if backend == SQUID:
        user = _squid_user() if os.geteuid() == 0 else None
        auth = None
        if lease_auth is not None:
            auth = local_auth.prepare_auth(
                instance_dir, lease_auth, user, squid_service(instance_dir)
            )
        access_log = ""
        if metered:
            where = log_dir(instance_dir)
            if where != instance_dir and user is not None:
                local_auth.own_dir_for(where, user)
            access_log = str(where / ACCESS_LOG)
            if any(c.isspace() for c in access_log):
                raise Permanent(
                    f"{access_log}: Squid cannot log to a path with spaces; use a dataDir "
                    "without spaces"
                )
        config = instance_dir / "squid.conf"
        text = squid_config(
            instance_dir,
            port,
            name,
            user,
            auth,
            outgoing=outgoing,
            targets=targets,
            parent=parent,
            access_log=access_log,
        )
        if parent is not None:
            local_auth.write_private(config, text.encode(), user)
        else:
            write_atomic(config, text.encode())
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(instance_dir, entry.pw_uid, entry.pw_gid)
        return [
            shutil.which(SQUID) or SQUID,
            "-N",
            "-n",
            squid_service(instance_dir),
            "-f",
            str(config),
        ]
    if parent is not None:
        raise Permanent(f"{name}: chaining to a proxy service needs the squid backend")
    if outgoing:
        # An instance recorded under backend proxypy, spawned by a provider now set to Squid.
        raise Permanent(
            f"{name}: recorded with backend proxypy, which cannot use outgoingAddress "
            f"{outgoing}; delete the instance so it is re-created with Squid"
        )
    plugins: list[str] = []
    if lease_auth is not None:
        # proxy.py runs as us and imports the plugin from this installation; the plugin finds
        # the key and its fencing state in the instance directory (its --data-dir).
        local_auth.write_key(instance_dir, lease_auth)
        plugins = ["--plugins", "services.providers.squidauth.proxypy.LeaseAuthPlugin"]
    return [
        sys.executable,
        "-m",
        "proxy",
        "--hostname",
        HOST,
        "--port",
        str(port),
        "--num-workers",
        "1",
        "--num-acceptors",
        "1",
        "--data-dir",
        str(instance_dir),
        "--log-file",
        str(instance_dir / "proxypy.log"),
        *plugins,
    ]


def spawn(command: list[str], instance_dir: Path) -> int:
    """Start ``command`` as the leader of a new session (so it outlives us and its whole group
    can be signalled), output to the instance log; returns its pid."""
    argv = ["/bin/sh", "-c", _PROLOGUE, str(instance_dir / PID_FILE), *command]
    log = str(instance_dir / LOG_FILE)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    # The proxy (and its helpers) must never hold the master secret, only its own key.
    env = {key: value for key, value in os.environ.items() if key != SECRET_ENV}
    return os.posix_spawn(
        argv[0],
        argv,
        env,
        file_actions=actions,
        setsid=True,
        # Python ignores SIGPIPE; a proxy must get the default disposition back.
        setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGTERM),
    )


def read_pid(instance_dir: Path) -> int:
    """The pid the process wrote itself, or 0 when it has not (yet)."""
    try:
        text = (instance_dir / PID_FILE).read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def is_running(pid: int, instance_dir: Path) -> bool:
    """Whether ``pid`` is alive and still the process we started for ``instance_dir`` (after a
    reboot the number may belong to someone else). Reaps it when it is our dead child."""
    if pid <= 0:
        return False
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # started by an earlier executor process: init reaps it, not us
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, under another user (Squid after dropping root)
    if not _PROC.is_dir():
        return True  # no procfs (macOS): liveness is all we can tell
    return _ours(pid, instance_dir) is not None


_PROC = Path("/proc")


def _ours(pid: int, instance_dir: Path) -> int | None:
    """The process group of ``pid`` if it is a live process started for ``instance_dir``."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        cmdline = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    # Fields after the parenthesised command name: state, ppid, pgrp, ...
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 3 or fields[0] in ("Z", "X"):
        return None  # gone, or a zombie nobody reaps (a container's init may not)
    # With the separator, instance "a" never claims the processes of instance "ab".
    if (str(instance_dir) + os.sep).encode() not in cmdline:
        return None
    return int(fields[2])


def group_members(pgid: int, instance_dir: Path) -> list[int]:
    """Live processes of the group led by ``pgid`` that were started for ``instance_dir``; the
    leader may be gone while its helpers (proxy.py workers) live on."""
    if pgid <= 0:
        return []  # never let 0 or -1 reach killpg: they mean "our own group" and "everyone"
    leader = is_running(pgid, instance_dir)
    if not _PROC.is_dir():
        return [pgid] if leader else []
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and _ours(int(entry.name), instance_dir) == pgid:
            members.append(int(entry.name))
    return members


async def accepts(port: int, timeout: float = 1.0) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    # A proxy still starting up may reset the connection it accepted; it did accept.
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is already gone
        os.killpg(pgid, sig)


async def terminate(pgid: int, instance_dir: Path, grace: float) -> None:
    """TERM the process group, KILL it after ``grace`` seconds, and wait until every member is
    gone. Only groups with a member started for ``instance_dir`` are signalled, so a recycled
    pid never costs a stranger its life."""
    if not group_members(pgid, instance_dir):
        return
    _signal_group(pgid, signal.SIGTERM)
    if await _wait_gone(pgid, instance_dir, grace):
        return
    _signal_group(pgid, signal.SIGKILL)
    if not await _wait_gone(pgid, instance_dir, 10.0):
        raise Transient(f"process group {pgid} of {instance_dir.name} survived SIGKILL")


async def _wait_gone(pgid: int, instance_dir: Path, seconds: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while group_members(pgid, instance_dir):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def allocate_port(low: int, high: int, taken: Collection[int]) -> int:
    """A port in [low, high] that no instance holds and nothing else is bound to. Starts at a
    random offset so concurrent providers on one host rarely probe the same ports."""
    span = high - low + 1
    start = random.randrange(span)  # spreading probes, not security
    for i in range(span):
        port = low + (start + i) % span
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        return port
    raise QuotaExceeded(
        f"no free port in {low}-{high}: {len(taken)} instances hold ports there; "
        "widen portRange or delete instances"
    )


def write_atomic(path: Path, data: bytes) -> None:
    """Readers (and a crash) see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def classify_os_error(what: str, exc: OSError) -> ProviderError:
    """Out of space is capacity (retry slowly); a missing binary or a forbidden path will not
    fix itself (latch Failed); anything else may pass (retry)."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE):
        error: ProviderError = QuotaExceeded(f"{what}: {exc}")
    elif code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOEXEC):
        error = Permanent(f"{what}: {exc}")
    else:
        error = Transient(f"{what}: {exc}")
    error.__cause__ = exc
    return error
