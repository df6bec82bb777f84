"""A run whose tests leave a process running fails, names it and kills it
(tests/support/leftovers.py): run for real, as a pytest inside this one, with and without xdist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli_process import alive
from tests.support.inner_pytest import run_pytest

pytestmark = pytest.mark.integration

SETTLE = "--leftover-settle=1"

LEAKING = """\
import subprocess
from pathlib import Path


def test_leaves_a_sleep(tmp_path):
    # A new session, as the local provider's proxies: the run ending does not end it.
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path({pids!r}, "token").write_text(str(child.pid))


def test_leaves_a_process_without_the_environment(tmp_path):
    # As libvirtd's QEMU: an environment of its own, the run's folder on its command line.
    disk = tmp_path / "disk.qcow2"
    disk.touch()
    child = subprocess.Popen(
        ["/usr/bin/tail", "-f", str(disk)], env={{}}, start_new_session=True
    )
    Path({pids!r}, "folder").write_text(str(child.pid))
"""

TIDY = """\
import subprocess


def test_stops_what_it_starts():
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    child.kill()
    child.wait()


def test_starts_nothing():
    pass
"""


@pytest.mark.parametrize("flags", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_a_process_left_running_fails_the_run_is_named_and_killed(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    done = run_pytest(tmp_path, {"test_inner.py": LEAKING.format(pids=str(pids))}, SETTLE, *flags)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "2 passed" in output
    assert "2 processes the tests started outlived the run (now killed):" in output
    by_token, by_folder = (int((pids / name).read_text()) for name in ("token", "folder"))
    assert f"pid {by_token}: sleep 300\n" in output
    assert f"pid {by_folder}: /usr/bin/tail -f {tmp_path}/temp/" in output
    assert not alive(by_token)
    assert not alive(by_folder)


@pytest.mark.parametrize("flags", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_a_run_that_stops_what_it_starts_passes(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """The controller, its workers and the processes already gone are not leftovers."""
    done = run_pytest(tmp_path, {"test_inner.py": TIDY}, SETTLE, *flags)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "2 passed" in output
    assert "outlived the run" not in output
