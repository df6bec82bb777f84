"""A pytest run inside a test, for the suite's own plugins (tests/support/leftovers.py,
tests/support/parallel.py): real processes, real xdist workers, its own temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.cli_process import ROOT


def run_pytest(
    tmp_path: Path, files: Mapping[str, str], *flags: str
) -> subprocess.CompletedProcess[str]:
    """pytest on ``files`` (name -> source) in ``tmp_path``/inner, with the suite's plugins and
    a folder of its own (``tmp_path``/temp): a run of its own never cleans this run's up."""
    tests = tmp_path / "inner"
    tests.mkdir()
    for name, source in files.items():
        (tests / name).write_text(source)
    command = [
        sys.executable, "-m", "pytest", str(tests),
        "-p", "tests.support.leftovers", "-p", "tests.support.parallel",
        "-p", "no:cacheprovider", "-p", "no:randomly", "--basetemp", str(tmp_path / "temp"),
        *flags,
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=tests,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
