"""The lease helper's cost per credential check: the real helper process, fed over a pipe the way
Squid feeds it (``--concurrent``, a window of requests in flight), its CPU time read from
``/proc`` over the measured checks only (after it has answered once, so Python's start-up is not
counted).

Three kinds of check: a current lease (its macs verify, then the fencing file is read under its
lock), a forged one (the right user name with a wrong password: the macs are computed and
refused) and the prober's. With ``--baseline FILE`` (the helper of an earlier version, e.g. the
one before D133 taken out of git history), the same checks go to that helper too, minted in its
own scheme (the lease id as the user name), and the figures are shown beside each other
(docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md).

Run: ``python -m bench.helper_auth [--checks 20000] [--rounds 3] [--window 32]
[--baseline FILE] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from services.providers.squidauth import helper
from services.providers.squidauth.pure import scheme

MASTER = b"bench-helper-auth-master-secret-0123"
UID = "5e0c7f4a-0000-4000-8000-00000000b001"
LEASE_ID = "0b8e3f0c-4a43-4d7e-9f1e-6a2b9c1d7e55"
KINDS = ("lease", "forged", "probe")
EXPECTED = {"lease": "OK", "forged": "ERR", "probe": "OK"}
Minter = Callable[[bytes, str, int], tuple[str, str]]


@dataclass
class Figure:
    """One helper, one kind of check: the best of the rounds (the least disturbed by others)."""

    helper: str
    kind: str
    checks: int
    cpu_us: float
    wall_us: float
    answers: dict[str, int] = field(default_factory=dict)


def new_scheme(key: bytes, kind: str, expires: int) -> tuple[str, str]:
    if kind == "probe":
        return scheme.probe_credential(key, expires)
    user, password = scheme.lease_credential(key, LEASE_ID, 7, expires)
    return (user, password) if kind == "lease" else (user, password[:-4] + "0000")


def _legacy_mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()[:32]


def legacy_scheme(key: bytes, kind: str, expires: int) -> tuple[str, str]:
    """The scheme of D84, which the helper before D133 checks: the lease id as the user name."""
    if kind == "probe":
        return scheme.PROBE_USER, f"{expires}.{_legacy_mac(key, f'probe|{expires}')}"
    mac = _legacy_mac(key, f"lease|{LEASE_ID}|7|{expires}")
    return LEASE_ID, f"7.{expires}.{mac if kind == 'lease' else mac[:-4] + '0000'}"


def _cpu_seconds(pid: int) -> float:
    """User and system time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    helper_file: Path, credential: tuple[str, str], checks: int, window: int, directory: Path
) -> tuple[float, float, Counter[str]]:
    """CPU seconds and wall seconds the helper took over ``checks`` checks, and its verdicts."""
    key_file, state_file = directory / "key", directory / "fence"
    key_file.write_text(scheme.proxy_key(MASTER, UID).hex() + "\n")
    state_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            *(sys.executable, str(helper_file), "--key-file", str(key_file)),
            *("--state-file", str(state_file), "--concurrent"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    user, password = credential
    line = f"{quote(user, safe='')} {quote(password, safe='')}\n".encode()
    verdicts: Counter[str] = Counter()
    try:
        process.stdin.write(b"0 " + line)
        process.stdin.flush()
        process.stdout.readline()  # started and answering: what follows is the checks alone
        cpu, wall = _cpu_seconds(process.pid), time.perf_counter()
        done = 0
        while done < checks:
            batch = min(window, checks - done)
            process.stdin.write(b"".join(b"%d %b" % (done + i, line) for i in range(batch)))
            process.stdin.flush()
            for _ in range(batch):
                answer = process.stdout.readline().split()
                verdicts[answer[1].decode() if len(answer) > 1 else "?"] += 1
            done += batch
        cpu, wall = _cpu_seconds(process.pid) - cpu, time.perf_counter() - wall
    finally:
        process.stdin.close()
        process.wait(timeout=30)
        process.stdout.close()
    return cpu, wall, verdicts


def run(
    checks: int = 20000, rounds: int = 3, window: int = 32, baseline: Path | None = None
) -> list[Figure]:
    helpers: list[tuple[str, Path, Minter]] = [("new", Path(helper.__file__), new_scheme)]
    if baseline is not None:
        helpers.append(("baseline", baseline, legacy_scheme))
    key = scheme.proxy_key(MASTER, UID)
    expires = time.time_ns() // 10**6 + 3_600_000
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as directory:
        for kind in KINDS:
            # Each helper's round follows the other's, so a busy moment weighs on both alike.
            best: dict[str, Figure] = {}
            for _ in range(rounds):
                for name, path, mint in helpers:
                    credential = mint(key, kind, expires)
                    cpu, wall, verdicts = measure(path, credential, checks, window, Path(directory))
                    figure = Figure(
                        name, kind, checks, cpu / checks * 1e6, wall / checks * 1e6, dict(verdicts)
                    )
                    if name not in best or figure.cpu_us < best[name].cpu_us:
                        best[name] = figure
            figures.extend(best.values())
    return figures


def render(figures: Sequence[Figure]) -> str:
    lines = [
        "| helper | check | checks | CPU µs per check | wall µs per check | answers |",
        "|---|---|---:|---:|---:|---|",
    ]
    for f in figures:
        answers = ", ".join(f"{k} {v}" for k, v in sorted(f.answers.items()))
        lines.append(
            f"| {f.helper} | {f.kind} | {f.checks} | {f.cpu_us:.1f} | {f.wall_us:.1f} | {answers} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=32, help="requests in flight (concurrency=)")
    parser.add_argument("--baseline", type=Path, help="an earlier helper.py to compare with")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = run(args.checks, args.rounds, args.window, args.baseline)
    print(render(figures))
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")


if __name__ == "__main__":
    main()
