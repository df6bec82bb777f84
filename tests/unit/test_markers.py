"""The rules that keep server tests marked (tests/support/markers.py), and the guard that stops a
test without a server marker from starting one."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type information
import pytest

from tests.support import markers
from tests.support.markers import ServerInPureTest, Starts, problems, starts

NATS = Starts("a nats-server")
LIBVIRTD = Starts("libvirtd", marker="kvm")


# ------------------------------------------------------------------------------ the rules


@pytest.mark.parametrize("directory", ["integration", "client", "e2e", "reliability"])
def test_a_test_where_servers_run_needs_a_server_marker(directory: str) -> None:
    (problem,) = problems(directory, {"asyncio", "parametrize"}, {})
    assert f"is under tests/{directory}" in problem
    assert "e2e, integration, kvm, reliability" in problem


@pytest.mark.parametrize("directory", ["integration", "client"])
def test_any_server_marker_will_do_in_integration_and_client(directory: str) -> None:
    for marker in sorted(markers.SERVER_MARKERS):
        assert problems(directory, {marker}, {}) == []


@pytest.mark.parametrize("directory", ["e2e", "reliability"])
def test_a_test_in_e2e_or_reliability_carries_the_marker_named_like_it(directory: str) -> None:
    """Else ``-m reliability`` would skip a reliability test marked only integration."""
    assert problems(directory, {directory}, {}) == []
    assert problems(directory, {directory, "kvm"}, {}) == []
    (problem,) = problems(directory, {"integration"}, {})
    assert problem == (
        f"is under tests/{directory} but is marked integration: it needs the {directory} "
        f"marker, or -m {directory} skips it (pytestmark = pytest.mark.{directory})"
    )


def test_a_unit_test_carries_no_server_marker() -> None:
    assert problems("unit", {"parametrize"}, {}) == []
    (problem,) = problems("unit", {"integration", "parametrize"}, {})
    assert "marked integration: move it to tests/integration" in problem


def test_a_test_using_a_server_fixture_needs_a_marker_wherever_it_is() -> None:
    (problem,) = problems("", set(), {"nats_server": NATS})
    assert problem.startswith("uses 'nats_server', which starts a nats-server: it needs one of")
    assert problems("", {"reliability"}, {"nats_server": NATS}) == []
    # In tests/unit both rules speak: the fixture wants a marker, the directory refuses it.
    assert len(problems("unit", set(), {"nats_server": NATS})) == 1
    assert len(problems("unit", {"integration"}, {"nats_server": NATS})) == 1


def test_a_fixture_can_ask_for_one_marker() -> None:
    (problem,) = problems("integration", {"integration"}, {"libvirtd": LIBVIRTD, "conn": NATS})
    assert problem == "uses 'libvirtd', which starts libvirtd: it needs the kvm marker"
    assert problems("integration", {"integration", "kvm"}, {"libvirtd": LIBVIRTD}) == []


def test_the_directory_is_the_one_under_tests(tmp_path: Path) -> None:
    assert markers.directory_of(tmp_path / "tests/unit/test_x.py", tmp_path) == "unit"
    assert markers.directory_of(tmp_path / "tests/e2e/deep/test_x.py", tmp_path) == "e2e"
    assert markers.directory_of(tmp_path / "tests/test_x.py", tmp_path) == ""
    assert markers.directory_of(tmp_path / "bench/test_x.py", tmp_path) == ""


# ------------------------------------------------------------------------------- the tags


def test_a_tag_survives_wrapping() -> None:
    @starts("an HTTP origin")
    def origin() -> Iterator[None]:
        yield

    @functools.wraps(origin)
    def wrapper() -> Iterator[None]:
        yield from origin()

    assert markers.started_by(origin) == Starts("an HTTP origin")
    assert markers.started_by(wrapper) == Starts("an HTTP origin")
    assert markers.started_by(test_a_tag_survives_wrapping) is None


def test_a_tag_names_a_server_marker() -> None:
    with pytest.raises(ValueError, match="'slow' is not a server marker"):
        starts("a thing", marker="slow")


def test_the_shared_server_fixtures_are_tagged() -> None:
    from tests import conftest  # noqa: PLC0415 - the module pytest loaded
    from tests.integration import conftest as integration  # noqa: PLC0415
    from tests.support import kvm_fixtures  # noqa: PLC0415

    for fixture in (conftest.nats_server, integration.squid, integration.target):
        assert markers.started_by(fixture) is not None, fixture
    for fixture in (kvm_fixtures.libvirtd, kvm_fixtures.kvm_bridge, kvm_fixtures.hv):
        tag = markers.started_by(fixture)
        assert tag is not None
        assert tag.marker == "kvm"


# ------------------------------------------------------------------------------ the guard


def test_the_guard_is_on_in_a_test_without_a_server_marker() -> None:
    assert markers.guarded(socket.socket.listen)
    assert markers.guarded(subprocess.Popen.__init__)
    assert markers.guarded(os.posix_spawn)
    assert markers.guarded(grpc.server)


@pytest.fixture
def refused() -> Iterator[list[str]]:
    """A guard of this test's own on top of the one every pure test runs under, so that what it
    refuses is recorded here and does not fail the test."""
    found: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        markers.refuse_servers(patch, found)
        yield found


def test_listening_is_refused(refused: list[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(ServerInPureTest, match="listens on a socket") as caught:
            sock.listen()
    assert refused == ["listens on a socket (AF_INET)"]
    # Code that handles a busy port must not take the refusal for one.
    assert not isinstance(caught.value, OSError)


@pytest.mark.parametrize(
    ("args", "kwargs", "program"),
    [
        ([sys.executable, "-m", "services.cli.main", "up"], {}, os.path.basename(sys.executable)),
        (["/opt/bin/nats-server", "-js"], {}, "nats-server"),
        ("squid -N -f squid.conf", {"shell": True}, "squid"),
        (["anything"], {"executable": "/usr/sbin/libvirtd"}, "libvirtd"),
        ([b"python3.12", b"-c", b"pass"], {}, "python3.12"),
    ],
)
def test_server_programs_and_python_are_refused(
    refused: list[str], args: Any, kwargs: dict[str, Any], program: str
) -> None:
    with pytest.raises(ServerInPureTest, match=f"runs {program}"):
        subprocess.Popen(args, **kwargs)
    assert refused == [f"runs {program}"]


def test_other_programs_run(refused: list[str]) -> None:
    true = shutil.which("true")
    assert true is not None
    assert subprocess.run([true], check=False).returncode == 0
    assert refused == []


async def test_asyncio_subprocesses_are_refused(refused: list[str]) -> None:
    with pytest.raises(ServerInPureTest):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    assert refused == [f"runs {os.path.basename(sys.executable)}"]


def test_spawning_and_grpc_servers_are_refused(refused: list[str]) -> None:
    with pytest.raises(ServerInPureTest, match="spawns squid"):
        os.posix_spawn("/usr/sbin/squid", ["squid"], {})
    with pytest.raises(ServerInPureTest, match="starts a gRPC server"):
        grpc.server(None)
    assert refused == ["spawns squid", "starts a gRPC server"]


def test_the_kvm_tests_are_one_group_by_their_files_name() -> None:
    assert markers.shared_group("tests/integration/test_kvm_gc.py::test_x[a/b]") == "kvm"
    assert markers.shared_group("tests/integration/test_kvm_contract.py::TestKvm::test_x") == "kvm"
    assert markers.shared_group("tests/integration/test_gc.py::test_kvm_x") == ""
    assert markers.shared_group("tests/integration/test_nats.py::test_x[tests/test_kvm_y]") == ""


def test_a_kvm_test_outside_the_kvm_files_is_refused() -> None:
    assert markers.group_problems("tests/integration/test_kvm_gc.py::test_x", {"kvm"}) == []
    assert markers.group_problems("tests/integration/test_kvm_gc.py::test_x", set()) == []
    assert markers.group_problems("tests/integration/test_gc.py::test_x", {"integration"}) == []
    (problem,) = markers.group_problems("tests/integration/test_gc.py::test_x", {"kvm"})
    assert problem.startswith("is marked kvm but its file's name does not start with test_kvm_")
