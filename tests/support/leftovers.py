"""A pytest plugin that fails the run when a process the tests started outlives it
(docs/decisions/0145-parallel-tests.md); tests/conftest.py loads it.

The controller (the only process with xdist, the one process without) puts a token of its own in
its environment before any test runs: every worker, and every process a test starts that
inherits the environment (nats-server, `up` and its services, Squid and its lease helpers,
kube-apiserver and etcd, libvirtd), carries it, even after its parent died and it was adopted by
init. A process that clears its environment (libvirtd's QEMU) is found by its command line,
which names a file under the run's temporary directory. When the session ends, after the workers
did, whatever still carries either is named, the run fails, and the processes are killed, so that
a failed run leaves nothing behind either.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

RUN_ENV = "EGRESS_TESTS_RUN"
"""The variable holding the run's token."""
SETTLE_SECONDS = 10.0
"""How long the processes may take to exit once the session ended (``--leftover-settle``): the
workers end, a lease helper whose Squid was killed reads the end of its input. A process still
there then has leaked."""
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    command: str

    def __str__(self) -> str:
        return f"pid {self.pid}: {self.command}"


def started_by_run(environ: bytes, cmdline: bytes, token: str, basetemp: str) -> bool:
    """Whether a process with this ``/proc/PID/environ`` and ``cmdline`` (NUL-separated) was
    started by the run of ``token`` whose temporary directory is ``basetemp``."""
    if f"{RUN_ENV}={token}".encode() in environ.split(b"\0"):
        return True
    if not basetemp:
        return False
    # pytest-12 is not pytest-123: the directory itself, or a path inside it.
    folder = basetemp.rstrip("/").encode()
    return any(
        argument.endswith(folder) or folder + b"/" in argument for argument in cmdline.split(b"\0")
    )


def leftovers(token: str, basetemp: str, spare: frozenset[int]) -> list[Leftover]:
    """The processes of the run still alive, but those in ``spare`` (this one, its parents)."""
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's when the tests do not run as root
            environ = b""
        # A zombie or a kernel thread has no command line, and runs nothing.
        if cmdline and started_by_run(environ, cmdline, token, basetemp):
            command = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
            found.append(Leftover(int(entry.name), command[:300]))
    return sorted(found, key=lambda leftover: leftover.pid)


def ancestors(pid: int) -> Iterator[int]:
    """``pid`` and its parents up to init."""
    while pid > 0:
        yield pid
        try:
            stat = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            return
        pid = int(stat.rsplit(")", 1)[1].split()[1])


def kill(found: list[Leftover]) -> None:
    for leftover in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(leftover.pid, signal.SIGKILL)


def _is_controller(config: pytest.Config) -> bool:
    """With xdist, the process that runs no test and ends the session after the workers."""
    return not hasattr(config, "workerinput")


def _basetemp(config: pytest.Config) -> str:
    """The run's temporary directory (the workers' are inside it), or "" before there is one."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return ""
    return str(factory.getbasetemp())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--leftover-settle",
        type=float,
        default=SETTLE_SECONDS,
        metavar="SECONDS",
        help="how long processes the tests started may take to exit after the session before "
        "they fail the run as left running (default %(default)s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # A fresh token even when one is set: a pytest run by a test checks its own processes only.
    if _is_controller(config):
        os.environ[RUN_ENV] = secrets.token_hex(8)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """After every other finish (xdist's stops its workers), so only leaks remain."""
    result = yield
    config = session.config
    if not _is_controller(config) or RUN_ENV not in os.environ:
        return result
    token, basetemp = os.environ[RUN_ENV], _basetemp(config)
    spare = frozenset(ancestors(os.getpid()))
    deadline = time.monotonic() + float(config.getoption("leftover_settle"))
    while (found := leftovers(token, basetemp, spare)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if found:
        kill(found)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        some = f"{len(found)} processes" if len(found) > 1 else "a process"
        lines = [f"{some} the tests started outlived the run (now killed):"]
        lines += [f"  {leftover}" for leftover in found]
        if reporter is not None:
            reporter.write_sep("=", "processes left running", red=True)
            reporter.write_line("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
