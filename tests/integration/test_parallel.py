"""`make test`'s scheduler (tests/support/parallel.py) keeps the kvm tests on one worker and
spreads the others: run for real, as a pytest with two xdist workers inside this one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.inner_pytest import run_pytest

pytestmark = pytest.mark.integration

# Each test waits a little, so that both workers are up and asking for work while they run.
TESTS = """\
import time

import pytest


@pytest.mark.parametrize("n", range(6))
def test_one(n):
    time.sleep(0.2)
"""


def workers(output: str) -> dict[str, set[str]]:
    """Test file -> the workers that ran its tests, from ``-v``'s lines."""
    found: dict[str, set[str]] = {}
    for worker, module in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", output):
        found.setdefault(module, set()).add(worker)
    return found


def test_the_kvm_files_run_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    files = {f"test_kvm_{name}.py": TESTS for name in ("a", "b")}
    files |= {f"test_{name}.py": TESTS for name in ("c", "d", "e")}
    done = run_pytest(tmp_path, files, "-n", "2", "--dist", "loadgroup", "-v")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "scheduling tests via SharedOnOneWorker" in output
    assert "30 passed" in output
    ran = workers(output)
    assert set(ran) == set(files), output
    (kvm_worker,) = ran["test_kvm_a.py"] | ran["test_kvm_b.py"]
    assert set().union(*(ran[f"test_{name}.py"] for name in "cde")) == {"gw0", "gw1"}, ran
    assert kvm_worker in {"gw0", "gw1"}


def test_another_dist_is_xdists_own(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, {"test_kvm_a.py": TESTS}, "-n", "2", "--dist", "load", "-v")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "scheduling tests via LoadScheduling" in output
