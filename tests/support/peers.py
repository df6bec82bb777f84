"""Where the tests find the peers built from pinned Go modules (kube-apiserver, kubectl, etcd, the
``nats`` CLI): ``EGRESS_PEERS_BIN`` when ``make test`` set it, else what ``deploy/peers.sh`` prints
(instant once built; it builds what is missing, with its progress on stderr).

A missing peer fails the test that needs it, with the command that builds it: a test skipped for
want of a binary would count as a pass that proved nothing.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("kube-apiserver", "kubectl", "etcd", "nats")


@functools.cache
def peers_dir() -> Path:
    given = os.environ.get("EGRESS_PEERS_BIN")
    if given:
        return Path(given)
    done = subprocess.run(
        ["sh", str(ROOT / "deploy" / "peers.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(
            f"deploy/peers.sh failed (exit {done.returncode}); run `make peers` to see why:\n"
            f"{done.stderr[-2000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def peer(name: str) -> Path:
    """The path of one peer binary; raises, naming the fix, when it is not built."""
    if name not in NAMES:
        raise ValueError(f"unknown peer {name!r}; one of {', '.join(NAMES)}")
    path = peers_dir() / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: run `make peers` (deploy/peers.sh) to build it")
    return path
