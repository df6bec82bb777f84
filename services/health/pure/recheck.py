"""When holders' ``failed`` reports call for a probe now rather than at the proxy's next turn.

Pure: the health service folds the ``LEASE`` stream with the lease fold (``projections.lease``),
whose view counts a proxy's consecutive ``failed`` reports (``Reports.failed_streak``, reset by a
``success`` or ``blocked`` one). Each time one applied event takes that streak to a multiple of
``--failed-reports-recheck`` (N, 2N, 3N, ...), the proxy is due for a recheck.

Only a view that moved forward counts: an event the service has applied before (a view whose
sequence does not advance, as on a rebuild) or a streak that went down never triggers one, so a
rebuild from the start of the stream cannot turn history into a burst of probes.
"""

from __future__ import annotations

from projections.lease import LeaseView

DEFAULT_FAILED_REPORTS_RECHECK = 3
MAX_FAILED_REPORTS_RECHECK = 1000
"""A larger streak is no longer a hint worth acting on early: the proxy's own interval wins."""


def failed_streak(view: LeaseView | None) -> int:
    """The view's consecutive ``failed`` reports; 0 without a view (or below 0, which no fold
    writes)."""
    return max(0, view.reports.failed_streak) if view is not None else 0


def crossed(before: int, after: int, every: int) -> bool:
    """Whether a streak going from ``before`` to ``after`` reached a multiple of ``every`` it
    had not reached already; never for ``every`` <= 0 (off) or a streak that did not grow."""
    if every <= 0:
        return False
    before, after = max(0, before), max(0, after)
    return after > before and after // every > before // every


def recheck_due(before: LeaseView | None, after: LeaseView, every: int) -> bool:
    """Whether folding one event into ``before`` (None: the proxy's first event) giving ``after``
    makes the proxy due for a recheck with ``--failed-reports-recheck`` ``every``."""
    if before is not None and after.last_seq <= before.last_seq:
        return False  # not a newer event: a replay or a view going backwards
    return crossed(failed_streak(before), failed_streak(after), every)


def check_every(value: object) -> int:
    """``value`` as a ``--failed-reports-recheck`` count; ValueError naming the bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number, not {value!r}")
    if not 0 <= value <= MAX_FAILED_REPORTS_RECHECK:
        raise ValueError(f"must be between 0 (off) and {MAX_FAILED_REPORTS_RECHECK}, not {value}")
    return value
