"""The hot paths' benchmarks, run on the last landing's code and on this tree in the same
session, arms alternated (docs/benchmarks.md, "Comparing with the last landing").

A figure measured today against one written down last week compares two machines' moods; the
same benchmark run on both commits, one after the other and in turns, compares the code. The
base commit is checked out into a temporary worktree (removed after), and each arm runs as
``python -m bench.<name>`` from its own tree. Every figure that moved the wrong way by more
than 10% is a regression, named in the table and in the exit code.

    python -m bench.compare --base <last landed commit> --rounds 2
    python -m bench.compare --base HEAD~3 --benches discovery eventlog --json compare.json

Exit codes: 0 no regression, 3 a regression (the table names it), 2 a benchmark failed on an
arm (its log is kept and named), 1 a bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.compare_figures import BENCHES, BY_NAME, THRESHOLD, Bench, Verdict, judge

ROOT = Path(__file__).resolve().parent.parent
REGRESSION, FAILED = 3, 2


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def run_arm(bench: Bench, tree: Path, out: Path, *, quick: bool) -> dict[str, Any] | None:
    """One run of ``bench`` from ``tree``; its JSON, or None when it failed (its output is kept
    beside ``out``)."""
    arguments = bench.quick if quick else bench.arguments
    command = [sys.executable, "-m", bench.module, *arguments, "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = out.with_suffix(".log")
    with log.open("wb") as sink:
        done = subprocess.run(command, cwd=tree, env=env, stdout=sink, stderr=sink, check=False)
    if done.returncode != 0 or not out.exists():
        return None
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def compare(
    benches: list[Bench], base_tree: Path, rounds: int, work: Path, *, quick: bool
) -> tuple[list[Verdict], list[str]]:
    verdicts: list[Verdict] = []
    failures: list[str] = []
    arms = {"base": base_tree, "head": ROOT}
    for bench in benches:
        docs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
        for r in range(rounds):
            order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
            for arm in order:
                out = work / f"{bench.name}-{arm}-{r + 1}.json"
                print(f"{bench.name}, round {r + 1}: {arm}", file=sys.stderr, flush=True)
                doc = run_arm(bench, arms[arm], out, quick=quick)
                if doc is None:
                    log = out.with_suffix(".log").name
                    failures.append(f"{bench.name} on {arm}, round {r + 1} ({log})")
                else:
                    docs[arm].append(doc)
        verdicts += judge(bench, docs["base"], docs["head"])
    return verdicts, failures


def render(verdicts: list[Verdict], base: str, console: Console) -> None:
    table = Table(title=f"this tree against {base[:12]}, medians of the rounds")
    for column in ("bench", "figure", "base", "head", "change", ""):
        table.add_column(column, justify="left" if column in ("bench", "figure") else "right")
    for v in verdicts:
        change = v.change
        shown = "n/a" if change is None else f"{change:+.1%}"
        mark = "REGRESSION" if v.regression else ""
        table.add_row(v.bench, v.figure, _values(v.base), _values(v.head), shown, mark)
    console.print(table)


def _values(values: list[float]) -> str:
    return ", ".join(f"{x:,.1f}" for x in values) or "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--base", required=True, help="the commit to compare with (a ref works)")
    parser.add_argument(
        "--benches", nargs="+", choices=list(BY_NAME), default=[b.name for b in BENCHES]
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs per arm, alternated")
    parser.add_argument("--quick", action="store_true", help="the smallest runs (a smoke test)")
    parser.add_argument("--json", type=Path, help="also write the verdicts to this file")
    parser.add_argument(
        "--work", type=Path, help="where the base's worktree and the runs' files go (a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    base = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    with tempfile.TemporaryDirectory(prefix="bench-compare-", dir=args.work) as tmp:
        work = Path(tmp)
        tree = work / "base"
        _git("worktree", "add", "--detach", str(tree), base)
        try:
            benches = [BY_NAME[name] for name in args.benches]
            verdicts, failures = compare(benches, tree, args.rounds, work, quick=args.quick)
        finally:
            _git("worktree", "remove", "--force", str(tree))
        kept = _keep_logs(work, failures)
    render(verdicts, base, Console())
    regressions = [v for v in verdicts if v.regression]
    for v in regressions:
        print(f"regression over {THRESHOLD:.0%}: {v.bench}, {v.figure}", file=sys.stderr)
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    if kept:
        print(f"logs of the failed runs: {kept}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(_document(base, verdicts, failures), indent=2) + "\n")
    if failures:
        return FAILED
    return REGRESSION if regressions else 0


def _keep_logs(work: Path, failures: list[str]) -> str:
    """The failed runs' logs, copied out of the temporary directory before it goes."""
    if not failures:
        return ""
    keep = Path(tempfile.mkdtemp(prefix="bench-compare-logs-"))
    for log in work.glob("*.log"):
        (keep / log.name).write_bytes(log.read_bytes())
    return str(keep)


def _document(base: str, verdicts: list[Verdict], failures: list[str]) -> dict[str, Any]:
    return {
        "base": base,
        "threshold": THRESHOLD,
        "verdicts": [
            {
                "bench": v.bench,
                "figure": v.figure,
                "better": v.better,
                "base": v.base,
                "head": v.head,
                "change": v.change,
                "regression": v.regression,
            }
            for v in verdicts
        ],
        "failures": failures,
    }


if __name__ == "__main__":
    sys.exit(main())
