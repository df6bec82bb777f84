"""The way of one lease request to its answer: claim, catch up, wait, or refuse.

``services.discovery.leasing.leases`` claims candidates, brings the views to the log's end,
queues the request and counts what happened; which of those comes next is decided here, from
what it saw: whether a claim was granted, the status of the refusal the views give when none
was, and the queue. The rules:

- A request that may wait (``waitSeconds``) while others already wait on this replica joins
  the queue behind them without claiming first: the proxy that frees up is theirs.
- A 503 (``pure.refusals.is_busy``) is an answer about the whole fleet, so before it is given
  the views are brought to the log's end once and the claim is tried again if they moved (a
  proxy released on another replica a moment ago).
- Then a request that may wait waits, once, if the queue has room.
- Anything else is refused: a 422 at once (waiting will not help), a 503 when the wait is over.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from services.discovery.pure.refusals import is_busy


class Move(StrEnum):
    CATCH_UP = "catch-up"
    """Bring the views to the log's end; claim again if they moved."""
    WAIT = "wait"
    """Queue until a matching proxy frees up or the wait is over."""
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Acquisition:
    """One request's rules: ``wait``, the seconds it may wait; ``queued``, whether others
    waited on this replica when it came (then it does not claim first)."""

    wait: float
    queued: bool

    @classmethod
    def of(cls, wait: float, waiting: int) -> Acquisition:
        """A request that may wait ``wait`` seconds, with ``waiting`` requests queued."""
        return cls(wait, wait > 0 and waiting > 0)

    @property
    def claims_first(self) -> bool:
        return not self.queued

    def after(self, status: int, done: Collection[Move], *, full: bool) -> Move:
        """The next move of a request that has no lease yet: ``status``, the refusal's the
        views give now; ``done``, the moves made so far; ``full``, whether the queue is."""
        if is_busy(status):
            if not self.queued and Move.CATCH_UP not in done:
                return Move.CATCH_UP
            if self.wait > 0 and Move.WAIT not in done and not full:
                return Move.WAIT
        return Move.REFUSE

    @staticmethod
    def result(status: int) -> str:
        """The ``egress_lease_acquisitions_total`` result of a refusal."""
        return "busy" if is_busy(status) else "no_match"
