"""Placing members over provider instances by weight (docs/architecture.md, "Pools").

Largest remainders: 20 members over weights 2:1 are 13 and 7, and every count is within one of
its exact share. Ties go to the provider listed first, so every replica places alike.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from events.pool import SpreadEntry
from projections.pool import PoolView


def shares(total: int, entries: Sequence[SpreadEntry]) -> dict[str, int]:
    """How many of ``total`` members each provider should hold."""
    if not entries:
        return {}
    weight = sum(e.weight for e in entries)
    exact = [(total * e.weight) / weight for e in entries]
    counts = {e.provider: int(x) for e, x in zip(entries, exact, strict=True)}
    left = total - sum(counts.values())
    order = sorted(range(len(entries)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for i in order[:left]:
        counts[entries[i].provider] += 1
    return counts


def next_provider(entries: Sequence[SpreadEntry], have: Mapping[str, int], total: int) -> str:
    """The provider a new member goes to: the one furthest below its share of ``total``
    (relative to its weight), the first listed on a tie."""
    want = shares(total, entries)
    best = min(
        range(len(entries)),
        key=lambda i: (
            have.get(entries[i].provider, 0) - want[entries[i].provider],
            have.get(entries[i].provider, 0) / entries[i].weight,
            i,
        ),
    )
    return entries[best].provider


def over_share(entries: Sequence[SpreadEntry], have: Mapping[str, int], total: int) -> list[str]:
    """Providers holding more than their share of ``total``, the most over first."""
    want = shares(total, entries)
    over = [(have.get(p, 0) - n, p) for p, n in want.items() if have.get(p, 0) > n]
    over += [(n, p) for p, n in have.items() if p not in want and n > 0]
    return [p for _, p in sorted(over, key=lambda x: (-x[0], x[1]))]


def placements(
    pool: PoolView, now: datetime, also: Collection[str] = ()
) -> tuple[list[SpreadEntry], list[str]]:
    """The providers new members may go to, and those left out because they failed a member
    lately, or ``also`` (failed in the decision being made, not folded yet); all of them stay
    if every one did: a pool keeps trying somewhere."""
    entries = list(pool.spec.spread) or [SpreadEntry(provider=pool.spec.template.provider)]
    failing = pool.failing(now) | frozenset(also)
    usable = [e for e in entries if e.provider not in failing]
    if not usable:
        return entries, []
    return usable, sorted(e.provider for e in entries if e.provider in failing)
