"""An autoscaled pool's size (docs/pools.md, "Autoscale"; docs/architecture.md, "Pools").

The load a pool must carry is its leased members plus the distinct holders discovery could not
serve lately (waiting, or refused with a 503): ``wanted = ceil(load / targetLeased)`` members,
held within ``min`` and ``max``. The decider does not act on one look: the direction the load
points (``up``: wanted above the size; ``down``: below it and nobody unserved; else ``steady``)
is recorded as a ``PoolPressure`` when it turns, and only a direction held for
``scaleUpAfter`` (``scaleDownAfter``) changes the size, to what is wanted then. Every replica
counts from the recorded instant, and a scale starts the count again, so the members just asked
for get their time to come up before the next step. A scale-down never takes a leased member
(``decide._shrink``): the size falls, and the leased surplus goes when its leases end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from events.pool import Autoscale, PoolFigures
from projections.pool import PoolView
from projections.pool_demand import Demand


@dataclass(frozen=True, slots=True)
class Step:
    """What the autoscaler asks of this evaluation: a turn of the pressure to record, or a new
    size (with the note that says why), or nothing."""

    pressure: str | None = None
    scaled_to: int | None = None
    wanted: int = 0
    note: str = ""


def wanted(a: Autoscale, figures: PoolFigures, demand: Demand) -> int:
    load = figures.leased + demand.unserved
    return min(max(math.ceil(load / a.target_leased), a.min), a.max)


def pressure_of(size: int, want: int, figures: PoolFigures, demand: Demand) -> str:
    """``down`` only with every member Ready: a pool still coming up has no load to judge."""
    if want > size:
        return "up"
    if want < size and not demand.unserved and not demand.waiting and figures.ready >= size:
        return "down"
    return "steady"


def step(pool: PoolView, figures: PoolFigures, demand: Demand, now: datetime) -> Step:
    a = pool.spec.autoscale
    if a is None or pool.deleting:
        return Step()
    size = pool.replicas
    if not a.min <= size <= a.max:
        held = min(max(size, a.min), a.max)
        return Step(
            scaled_to=held, wanted=held, note=f"held within {a.min}..{a.max} ({size} -> {held})"
        )
    want = wanted(a, figures, demand)
    pressure = pressure_of(size, want, figures, demand)
    if pressure != pool.pressure:
        return Step(pressure=pressure, wanted=want)
    since = pool.pressure_since or pool.created_at
    if pressure == "steady" or since is None:
        return Step()
    wait = a.scale_up_after_seconds if pressure == "up" else a.scale_down_after_seconds
    if (now - since).total_seconds() < wait:
        return Step()
    why = (
        f"{figures.leased} leased, {demand.unserved} unserved ({demand.waiting} waiting), "
        f"target {a.target_leased:g} leased"
    )
    return Step(
        scaled_to=want, wanted=want, note=f"{pressure} for {wait:g}s: {size} -> {want} ({why})"
    )
