"""The markers of tests that start servers, and the checks that keep ``-m`` selections honest.

A test that starts a server (nats-server, an HTTP or gRPC server, Squid, libvirtd, an SSH server)
or a process of the product carries one of ``SERVER_MARKERS``, so that
``pytest -m "not integration and not e2e and not kvm and not reliability"`` runs pure tests only.
tests/conftest.py holds that in two places:

- at collection, before ``-m`` deselects anything (``problems``): a test under tests/integration,
  tests/client, tests/e2e or tests/reliability carries a server marker (under tests/e2e and
  tests/reliability, the one named like the directory, so that ``-m reliability`` runs the whole
  directory), a test under tests/unit carries none (one that starts a server belongs in
  tests/integration), and a test using a fixture tagged with ``starts`` (directly or through other
  fixtures) carries the marker that fixture asks for;
- while a test without a server marker runs (``refuse_servers``): listening on a socket, spawning
  a proxy process, or running a server program or a Python subprocess (the product's CLI, a
  worker) fails it, whatever fixture or helper does it.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

SERVER_MARKERS = frozenset({"integration", "e2e", "kvm", "reliability"})

SERVER_DIRECTORIES = frozenset({"integration", "client", "e2e", "reliability"})
"""Directories under tests/ whose every test carries a server marker."""
DIRECTORY_MARKERS = {"e2e": "e2e", "reliability": "reliability"}
"""Directories under tests/ whose every test carries this one: a selection by marker (``-m
reliability``) and one by directory must run the same tests."""
PURE_DIRECTORY = "unit"
"""The directory under tests/ whose tests carry none: they start no server."""

SERVER_PROGRAMS = frozenset({"nats-server", "squid", "libvirtd", "sshd", "egress-proxies"})
"""Programs a pure test may not run (nor any Python interpreter: the CLI, the workers)."""

_TAG = "_starts_server"
_GUARD = "_refuses_servers"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Starts:
    """What a fixture starts, and the marker a test using it must carry (any server marker if
    ``marker`` is None)."""

    what: str
    marker: str | None = None


def starts(what: str, *, marker: str | None = None) -> Callable[[F], F]:
    """Tag a fixture function as starting ``what``; put it below ``@pytest.fixture``."""
    if marker is not None and marker not in SERVER_MARKERS:
        raise ValueError(f"{marker!r} is not a server marker ({sorted(SERVER_MARKERS)})")

    def tag(fixture: F) -> F:
        setattr(fixture, _TAG, Starts(what, marker))
        return fixture

    return tag


def started_by(fixture: object) -> Starts | None:
    """The tag ``starts`` put on a fixture function, if any."""
    found = getattr(fixture, _TAG, None)
    if found is None and callable(fixture):
        found = getattr(inspect.unwrap(fixture), _TAG, None)
    return found if isinstance(found, Starts) else None


def problems(directory: str, markers: Collection[str], uses: Mapping[str, Starts]) -> list[str]:
    """What is wrong with a test under tests/``directory`` that carries ``markers`` and uses the
    fixtures ``uses`` (fixture name -> what it starts); empty when nothing is."""
    carried = SERVER_MARKERS.intersection(markers)
    choices = f"one of the markers {', '.join(sorted(SERVER_MARKERS))}"
    found = []
    if directory in SERVER_DIRECTORIES and not carried:
        found.append(
            f"is under tests/{directory}, whose tests start servers: it needs {choices} "
            "(e.g. pytestmark = pytest.mark.integration)"
        )
    wanted = DIRECTORY_MARKERS.get(directory)
    if carried and wanted is not None and wanted not in carried:
        found.append(
            f"is under tests/{directory} but is marked {', '.join(sorted(carried))}: it needs "
            f"the {wanted} marker, or -m {wanted} skips it (pytestmark = pytest.mark.{wanted})"
        )
    if directory == PURE_DIRECTORY and carried:
        found.append(
            f"is under tests/unit, whose tests are pure, but is marked "
            f"{', '.join(sorted(carried))}: move it to tests/integration"
        )
    for name, what in sorted(uses.items()):
        if what.marker is not None and what.marker not in carried:
            found.append(
                f"uses {name!r}, which starts {what.what}: it needs the {what.marker} marker"
            )
        elif what.marker is None and not carried:
            found.append(f"uses {name!r}, which starts {what.what}: it needs {choices}")
    return found


def directory_of(path: Path, root: Path) -> str:
    """The directory under tests/ a test file is in ("" outside tests/)."""
    parts = path.relative_to(root).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else ""


def is_server_test(markers: Iterable[str]) -> bool:
    return not SERVER_MARKERS.isdisjoint(markers)


SHARED_FILES = {"kvm": "test_kvm_"}
"""The tests that share something of the machine two xdist workers would fight over, by the
marker they carry and the start of their file's name: the kvm tests write the VMs' addresses into
the kernel's one neighbour table and keep them at its front (tests/support/kvm_arp.py), and each
runs QEMU without KVM, which takes a core. `make test` runs them on one worker, one after another,
beside the rest (tests/support/parallel.py, docs/decisions/0145-parallel-tests.md). The scheduler
sees node ids only, not marks: hence the file's name, and the rule that the two agree."""


def shared_group(nodeid: str) -> str:
    """The group of tests the test ``nodeid`` runs with on one worker, or "" for none."""
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return next((group for group, start in SHARED_FILES.items() if module.startswith(start)), "")


def group_problems(nodeid: str, markers: Collection[str]) -> list[str]:
    """A test carrying a marker of ``SHARED_FILES`` must be in a file the scheduler groups."""
    group = shared_group(nodeid)
    return [
        f"is marked {marker} but its file's name does not start with {start}: the {marker} "
        f"tests run on one worker, found by that name (tests/support/markers.py SHARED_FILES)"
        for marker, start in sorted(SHARED_FILES.items())
        if marker in markers and group != marker
    ]


# ----------------------------------------------------------------------------- the guard


class ServerInPureTest(AssertionError):
    """Raised where a test without a server marker starts a server or a process of the product.
    Not an OSError: code that handles a busy port or a missing program must not swallow it."""


def refuse_servers(patch: pytest.MonkeyPatch, refused: list[str]) -> None:
    """Make listening on a socket, starting a gRPC server, ``os.posix_spawn`` (the local
    provider's proxies) and running a server program or a Python interpreter raise
    ``ServerInPureTest``; each refusal is also appended to ``refused``, so that one swallowed by
    the code under test still fails the test."""

    def refuse(what: str) -> ServerInPureTest:
        refused.append(what)
        return ServerInPureTest(
            f"a test without a server marker {what}: mark it with one of "
            f"{', '.join(sorted(SERVER_MARKERS))} and move it out of tests/unit"
        )

    def listen(self: socket.socket, *args: Any) -> None:
        raise refuse(f"listens on a socket ({self.family.name})")

    def posix_spawn(path: str, *args: Any, **kwargs: Any) -> int:
        raise refuse(f"spawns {os.path.basename(path)}")

    real_init = subprocess.Popen.__init__

    def popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        program = _program(args, kwargs)
        if program in SERVER_PROGRAMS or _is_python(program):
            raise refuse(f"runs {program}")
        real_init(self, args, *rest, **kwargs)

    def grpc_server(*args: Any, **kwargs: Any) -> None:
        raise refuse("starts a gRPC server")

    for guard in (listen, posix_spawn, popen_init, grpc_server):
        setattr(guard, _GUARD, True)
    patch.setattr(socket.socket, "listen", listen)
    patch.setattr(os, "posix_spawn", posix_spawn)
    patch.setattr(subprocess.Popen, "__init__", popen_init)
    # gRPC listens in its C core, out of reach of ``socket``; only if a test imported it.
    if "grpc" in sys.modules:
        patch.setattr(sys.modules["grpc"], "server", grpc_server)


def guarded(function: object) -> bool:
    """Whether ``function`` is one of the replacements ``refuse_servers`` installs."""
    return getattr(function, _GUARD, False) is True


def _program(args: Any, kwargs: Mapping[str, Any]) -> str:
    """The file name of the program a ``Popen(args, **kwargs)`` runs."""
    program = kwargs.get("executable") or args
    if isinstance(program, str | bytes | os.PathLike):
        text = os.fsdecode(program)
        if kwargs.get("shell") and program is args:
            text = (text.split() or [text])[0]
    else:
        text = os.fsdecode(next(iter(program)))
    return os.path.basename(text)


def _is_python(program: str) -> bool:
    return program == os.path.basename(sys.executable) or program.startswith("python")
