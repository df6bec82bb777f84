"""One data dir, one `up`, one nats-server (docs/decisions/0094-one-data-dir-one-up-one-nats.md).

Two nats-servers on one JetStream store each append to their own copy of a stream's files, and
the streams diverge for good. So `up` takes an exclusive lock on its data dir before it starts or
writes anything, and holds it until it returns; the kernel frees it when `up` dies however it
dies, so there is no stale lock to clear by hand. The lock file holds the holder's pid, for the
message of the `up` that is refused.

The server `up` starts dies with it (``die_with_parent``), so the lock also covers the server's
life; a server left running anyway (by an older version, or where there is no parent-death
signal) is found and stopped by the next `up` (``nats.stale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_FILE = "up.lock"
PR_SET_PDEATHSIG = 1
"""linux/prctl.h"""
POLL = 0.05
"""How often a process being stopped is looked at (it is not our child: nothing to wait on)."""


class DataDirBusy(RuntimeError):
    """Another process holds the data dir's lock."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        self.data_dir = data_dir
        self.pid = pid
        who = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
        super().__init__(f"{data_dir} is in use by another `egress-proxies up` ({who})")


@contextlib.contextmanager
def exclusive(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir``'s lock for the block, or raise ``DataDirBusy`` at once.

    The descriptor is not inherited (PEP 446), so no child of `up` (the nats-server, a local
    proxy that outlives `up` on purpose) keeps the lock after `up` is gone."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataDirBusy(data_dir, _pid_in(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


# ------------------------------------------------------------------------------ processes


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child SIGTERM when its parent dies, even by
    SIGKILL; None where there is no such signal (not Linux), and the next `up` stops a server
    left behind instead. The kernel sends it when the *thread* that forked dies: `up` starts its
    server from the event loop's thread, which lives as long as `up`.

    libc is loaded here, in the parent: the child of a threaded process must not load libraries
    between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    option, sig = ctypes.c_ulong(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGTERM)
    zero = ctypes.c_ulong(0)

    def in_child() -> None:
        prctl(option, sig, zero, zero, zero)
        if os.getppid() != parent:
            # The parent died between fork and prctl: no signal will come.
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return _signalable(pid)
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def command_line(pid: int) -> list[str]:
    """``pid``'s argv; empty when it is gone or cannot be read (then it is not ours to stop)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.decode(errors="replace").split("\0")[:-1]
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return []
    except OSError:
        return []
    # No /proc (macOS, the BSDs): ps prints the arguments joined by spaces.
    try:
        found = subprocess.run(
            ["ps", "-o", "args=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return found.stdout.split()


async def stop_process(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout``; returns once it is gone (it
    is not our child, so it is polled rather than waited for)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        for _ in range(max(1, round(timeout / POLL))):
            if not alive(pid):
                return
            await asyncio.sleep(POLL)
