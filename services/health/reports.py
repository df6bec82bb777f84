"""Following holders' reports: the ``LEASE`` stream folded with the lease fold, and the proxies
whose ``failed`` reports call for a recheck (``recheck.recheck_due``).

Only events applied after the catch-up count: the history a replica reads at start-up sets each
proxy's streak, and a recheck needs a report that arrives while the replica is running. The
fold wrapper only notes which proxies are due; ``step`` hands them on after the batch, so what
the prober does can never make an event look unusable to the projector.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.js import JetStreamContext

from events import subjects
from events.store import Recorded
from projections.lease import LeaseView, apply
from services.health.pure.recheck import failed_streak, recheck_due
from services.runtime.eventlog.projector import Projector

Recheck = Callable[[str, int], object]
"""Called with a proxy uid and its failed streak for each recheck due."""


class FailedReports:
    def __init__(self, js: JetStreamContext, every: int) -> None:
        self.every = every
        self.projector: Projector[LeaseView] = Projector(
            js, subjects.LEASE_STREAM, "lease.*", self._apply
        )
        self.live = False
        """Set once caught up: from then on, a streak reaching a multiple of ``every`` counts."""
        self.handled_seq = 0
        """The stream sequence up to which due rechecks were handed on (tests wait for it)."""
        self._due: dict[str, int] = {}

    def _apply(self, view: LeaseView | None, recorded: Recorded) -> LeaseView:
        after = apply(view, recorded)
        if self.live and recheck_due(view, after, self.every):
            self._due[after.proxy_uid] = failed_streak(after)
        return after

    async def catch_up(self) -> int:
        applied = await self.projector.catch_up()
        self.live = True
        self.handled_seq = self.projector.last_seq
        return applied

    async def step(self, recheck: Recheck) -> int:
        """Apply one batch and call ``recheck`` for every proxy it made due, once each."""
        applied = await self.projector.step()
        due, self._due = self._due, {}
        for uid, streak in due.items():
            recheck(uid, streak)
        self.handled_seq = self.projector.last_seq
        return applied

    async def close(self) -> None:
        await self.projector.close()
