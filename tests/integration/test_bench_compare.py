"""`bench compare` end to end, tiny: the base commit checked out beside this tree, both arms
run in turns, every figure read from both, the worktree gone after; a base whose benchmark
cannot run is a failure named with its log, never a silent pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def compare(tmp_path: Path, base: str) -> tuple[int, dict[str, object], str]:
    out = tmp_path / "compare.json"
    command = [sys.executable, "-m", "bench.compare", "--base", base, "--benches", "eventlog"]
    command += ["--rounds", "1", "--quick", "--json", str(out), "--work", str(tmp_path)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


def worktrees(under: Path) -> list[str]:
    """The repository's worktrees under ``under`` (the other test of this file may run beside
    this one, with a worktree of its own)."""
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [line for line in listed.splitlines() if str(under) in line]


def test_both_arms_report_every_figure_and_the_worktree_goes(tmp_path: Path) -> None:
    code, doc, output = compare(tmp_path, "HEAD")
    assert code in (0, 3), output  # 3: a quick run's noise may pass for a regression
    assert doc["failures"] == [], output
    verdicts = doc["verdicts"]
    assert isinstance(verdicts, list)
    assert len(verdicts) == 3
    for verdict in verdicts:
        assert len(verdict["base"]) == 1, verdict
        assert len(verdict["head"]) == 1, verdict
        assert verdict["change"] is not None
    assert "append events/s" in output
    assert worktrees(tmp_path) == []


def test_a_base_whose_benchmark_cannot_run_is_a_failure(tmp_path: Path) -> None:
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    code, doc, output = compare(tmp_path, first)
    assert code == 2, output
    assert doc["failures"] == ["eventlog on base, round 1 (eventlog-base-1.log)"], output
    assert "logs of the failed runs" in output
    verdicts = doc["verdicts"]
    assert isinstance(verdicts, list)
    assert all(v["base"] == [] and v["change"] is None for v in verdicts)
