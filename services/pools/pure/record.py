"""The event that records a pool controller's decision on the pool's aggregate."""

from __future__ import annotations

from events.pool import PoolDecided, PoolPressure, PoolRemoved
from projections.pool import PoolView
from services.pools.pure.decide import Decision


def recorded_as(decision: Decision, pool: PoolView) -> PoolDecided | PoolRemoved | PoolPressure:
    """The event that records ``decision`` on the pool's aggregate."""
    if decision.remove:
        return PoolRemoved(uid=pool.uid)
    if decision.pressure is not None:
        return PoolPressure(
            uid=pool.uid,
            pressure=decision.pressure,
            wanted=decision.wanted,
            figures=decision.figures,
        )
    return PoolDecided(
        uid=pool.uid,
        reason=decision.reason,
        message=decision.message,
        added=decision.added,
        retired=decision.retired,
        recycled=decision.recycled,
        rolled=decision.rolled,
        figures=decision.figures,
        generation=pool.generation,
        scaled_to=decision.scaled_to,
    )
