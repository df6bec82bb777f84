"""Which of several regions or zones an instance goes to.

A stable hash of the instance name, not a round-robin counter: a repeated create (the executor
retrying after a crash) must ask for the same place, or it would make a second instance
elsewhere; and names differ per proxy and per replacement, so a fleet spreads evenly without
anyone counting. A Proxy that names its place (``spec.placement``) is not spread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def spread(choices: Sequence[str], key: str) -> str:
    """One of ``choices`` for ``key``, the same every time; ValueError when there are none."""
    if not choices:
        raise ValueError("nothing to spread over")
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return choices[int.from_bytes(digest[:8], "big") % len(choices)]
