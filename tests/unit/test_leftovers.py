"""Which processes count as the run's (tests/support/leftovers.py): its token in their
environment, or its temporary directory on their command line."""

from __future__ import annotations

import os

from tests.support.leftovers import RUN_ENV, ancestors, started_by_run

TOKEN = "0123456789abcdef"
BASETEMP = "/tmp/pytest-of-root/pytest-12"


def nul(*parts: str) -> bytes:
    return b"".join(part.encode() + b"\0" for part in parts)


def test_a_process_carrying_the_runs_token_is_the_runs() -> None:
    environ = nul("PATH=/usr/bin", f"{RUN_ENV}={TOKEN}", "HOME=/root")
    assert started_by_run(environ, nul("/usr/sbin/squid", "-N"), TOKEN, BASETEMP)
    assert started_by_run(nul(f"{RUN_ENV}={TOKEN}"), nul("sleep"), TOKEN, "")


def test_another_runs_token_or_a_longer_one_is_not() -> None:
    for value in ("fedcba9876543210", TOKEN + "0", TOKEN[:-1]):
        environ = nul(f"{RUN_ENV}={value}")
        assert not started_by_run(environ, nul("/usr/sbin/squid", "-N"), TOKEN, BASETEMP)
    assert not started_by_run(nul(f"OTHER_{RUN_ENV}={TOKEN}"), nul("sleep"), TOKEN, BASETEMP)


def test_a_process_without_the_environment_is_the_runs_by_its_command_line() -> None:
    """libvirtd starts QEMU with an environment of its own; its disk is in the run's folder."""
    qemu = nul("qemu-system-x86_64", "-drive", f"file={BASETEMP}/popen-gw1/pool/px-1.qcow2")
    assert started_by_run(b"", qemu, TOKEN, BASETEMP)
    assert started_by_run(b"", nul("pytest", f"--basetemp={BASETEMP}"), TOKEN, BASETEMP)
    squid = nul("squid", "-f", f"{BASETEMP}/x/squid.conf")
    assert started_by_run(b"", squid, TOKEN, BASETEMP + "/")


def test_another_runs_folder_is_not_the_runs() -> None:
    """pytest numbers its folders: pytest-123 and pytest-1 are other runs than pytest-12."""
    for other in ("/tmp/pytest-of-root/pytest-123", "/tmp/pytest-of-root/pytest-1"):
        cmdline = nul("squid", "-f", f"{other}/x/squid.conf")
        assert not started_by_run(b"", cmdline, TOKEN, BASETEMP)
    assert not started_by_run(b"", nul("squid", "-f", "/etc/squid.conf"), TOKEN, BASETEMP)
    assert not started_by_run(b"", nul("squid", "-f", f"{BASETEMP}/x"), TOKEN, "")


def test_this_process_and_its_parents_are_spared() -> None:
    """pytest itself names the folder when given ``--basetemp``."""
    found = list(ancestors(os.getpid()))
    assert found[:2] == [os.getpid(), os.getppid()]
    assert len(set(found)) == len(found)
