"""The lease view: who holds a proxy, until when, and what its holders reported.

A pure fold over one proxy's ``lease.<uid>`` subject: ``apply(view, recorded) -> view``. No I/O and
no clock: every time is the JetStream timestamp of an event, and "now" is always the caller's
argument, so every replica (and a rebuild from sequence 1) agrees on the view.

The fold is also the arbiter of time. A ``LeaseAcquired`` holds only if, at its own timestamp, no
other lease of the proxy is active and the proxy's cooldown is over, or the cooldown is the
claim's own (``projections.cooldown``: it follows a lease of the same client, D153); otherwise
it is counted as ``rejected`` and changes nothing. A writer whose clock runs ahead can
therefore append a claim too early, but never create a second holder. ``LeaseExpired`` before
the lease's end, and releases of leases that are no longer current, are ignored the same way.

A lease whose ``expires_at`` has passed is over even when no ``LeaseExpired`` was recorded (yet):
``is_free(view, now)`` says so, and the next event settles it as expired at ``expires_at``. That
question and the others asked of a view are in ``projections.lease_queries``.

A ``LeaseRenewed`` moves the current lease's ``expires_at`` to its own timestamp plus its TTL
(never beyond ``MAX_LEASE_SECONDS`` after the grant, the LEASE stream's retention); a renewal
of a lease that is not current, or already past its end at the renewal's timestamp, changes
nothing, so a renewal racing a release or an expiry is decided by the order of the log.

Reports also feed ``projections.outcomes``: counters per proxy, and per (proxy, target) the
back-offs that ``blocked`` reports start. A claim naming a target (``LeaseAcquired.target``)
does not hold while that target has the proxy in back-off at the claim's timestamp, counted as
``rejected`` like a claim on a held proxy.

A ``LeaseSwitched`` (a rotation's replacement took over,
docs/decisions/0085-a-fresh-ip-without-downtime.md) gives the current lease a new fencing token, the
switch's stream sequence, and the instance it now goes through; a switch of a lease that is not
current changes nothing.

The fold is total: the log is immutable, so an event it cannot use (a TTL or cooldown that is
not a finite number within the bounds of ``events.schemas``, a naive deadline, an empty lease id)
is counted as ``unusable`` and changes nothing else, and a claim, release or report stamped after
its writer's ``deadline`` was answered as failed, so it is counted as ``late`` and changes
nothing either (docs/api.md, "When NATS is unreachable"). No event makes ``apply`` raise.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import msgspec

from events.schemas import (
    MAX_COOLDOWN_SECONDS,
    MAX_LEASE_SECONDS,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    LeaseRenewed,
    LeaseReported,
    LeaseSwitched,
)
from events.store import Recorded
from events.subjects import proxy_uid_of
from projections.cooldown import Claimant, follows
from projections.outcomes import Reports, blocked_until, record, target_key, usable_base

HISTORY = 20
"""Ended leases a view keeps (beyond the current one), and reports kept per view and per lease."""

ACTIVE = "active"
RELEASED = "released"
EXPIRED = "expired"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    lease_id: str
    outcome: str
    detail: str = ""
    target: str = ""
    at: datetime


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One lease of a proxy. ``end`` is empty while no event has ended it."""

    lease_id: str
    proxy_uid: str
    holder: str = ""
    client: str = ""
    """The API client that acquired it: only that client (or an admin) may use the lease."""
    acquired_at: datetime
    expires_at: datetime
    ttl_seconds: float
    requested_ttl_seconds: float = 0.0
    """What the client asked for (0: the default); above ``ttl_seconds`` when clamped."""
    fencing_token: int
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    cooldown_seconds: float = 0.0
    end: str = ""
    ended_at: datetime | None = None
    outcomes: tuple[Outcome, ...] = ()
    seq: int = 0
    renewed_at: datetime | None = None
    """The timestamp of the last renewal that counted; None while never renewed."""
    renewed_seq: int = 0
    """Its stream sequence: a writer learns from it that the fold counted its renewal."""
    rotation_id: str = ""
    """The rotation whose replacement the lease last switched to (``LeaseSwitched``); ""
    while it never switched."""
    provider_id: str = ""
    """The instance it switched to; "" while it never switched."""
    switched_at: datetime | None = None
    reason: str = ""
    """Why the system ended it (``LeaseReleased.reason``); "" while active, and for a lease its
    holder released or that expired."""


class LeaseView(msgspec.Struct, frozen=True, kw_only=True):
    proxy_uid: str
    current: LeaseRecord | None = None
    """The newest granted lease that no event has ended; it may be past ``expires_at``."""
    fencing_token: int = 0
    """The token of the newest granted lease: its ``LeaseAcquired``'s stream sequence (never less
    than the previous token + 1), so strictly increasing per proxy, but not consecutive; 0 while
    the view has seen no grant."""
    cooldown_until: datetime | None = None
    """Set when a lease ends; the proxy is not leased again before it, except by the client
    whose lease it follows (``projections.cooldown``)."""
    cooldown_client: str = ""
    """The client of the lease the cooldown follows (its ``LeaseRecord.client``)."""
    cooldown_holder: str = ""
    """Its holder: the open mode's clients are told apart by it (``projections.cooldown``)."""
    recent: tuple[LeaseRecord, ...] = ()
    """Ended leases, oldest first, at most ``HISTORY``."""
    outcomes: tuple[Outcome, ...] = ()
    """The last ``HISTORY`` reports about this proxy, oldest first."""
    granted: int = 0
    rejected: int = 0
    """Claims the fold refused: the proxy was held or cooling down at the claim's timestamp."""
    unusable: int = 0
    """Events ignored because a value in them is out of bounds (see the module's docstring)."""
    late: int = 0
    """Claims, releases and reports ignored because they were stamped after their deadline."""
    updated_at: datetime | None = None
    last_seq: int = 0
    reports: Reports = msgspec.field(default_factory=Reports)
    """Report counters and back-offs per target (``projections.outcomes``)."""

    @property
    def lease_id(self) -> str:
        return self.current.lease_id if self.current else ""

    @property
    def holder(self) -> str:
        return self.current.holder if self.current else ""

    @property
    def acquired_at(self) -> datetime | None:
        return self.current.acquired_at if self.current else None

    @property
    def expires_at(self) -> datetime | None:
        return self.current.expires_at if self.current else None


# ----------------------------------------------------------------------------------- fold


def _seconds(value: object, low: float, high: float, *, zero: bool) -> float | None:
    """``value`` as seconds if it is a finite number within bounds (0 only when ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < low or seconds > high:
        return None
    return seconds if seconds > 0 or zero else None


def plus_seconds(at: datetime, seconds: float) -> datetime:
    """``at`` plus ``seconds``, or the end of time instead of an overflow: with the bounds
    checked on the way in, only a timestamp near the year 9999 gets there."""
    try:
        return at + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=at.tzinfo)


ON_TIME = "on_time"
LATE = "late"
UNUSABLE = "unusable"


def _timing(deadline: object, at: datetime) -> str:
    """``LATE`` when the event was stamped after its writer's deadline, ``UNUSABLE`` when the
    deadline is naive (not comparable with a JetStream timestamp). No deadline: the event was
    written before they existed, and counts."""
    if not isinstance(deadline, datetime):
        return ON_TIME
    if deadline.tzinfo is None or deadline.utcoffset() is None:
        return UNUSABLE
    return LATE if at > deadline else ON_TIME


def on_time(deadline: object, at: datetime) -> bool:
    """Whether an event with this deadline, stamped ``at``, counts in the fold: what a writer
    asks after an append in doubt, so its answer is the fold's."""
    return _timing(deadline, at) == ON_TIME


def _ignored(view: LeaseView, why: str) -> LeaseView:
    if why == LATE:
        return msgspec.structs.replace(view, late=view.late + 1)
    return msgspec.structs.replace(view, unusable=view.unusable + 1)


def _ended(
    view: LeaseView, how: str, at: datetime, cooldown_until: datetime, reason: str = ""
) -> LeaseView:
    assert view.current is not None
    ended = msgspec.structs.replace(view.current, end=how, ended_at=at, reason=reason)
    return msgspec.structs.replace(
        view,
        current=None,
        recent=(*view.recent, ended)[-HISTORY:],
        cooldown_until=cooldown_until,
        cooldown_client=ended.client,
        cooldown_holder=ended.holder,
    )


def _resting(view: LeaseView, at: datetime, claimant: Claimant) -> bool:
    """The proxy rests at ``at`` from a lease that is not ``claimant``'s own (D153)."""
    if view.cooldown_until is None or at >= view.cooldown_until:
        return False
    return not follows(claimant, view.cooldown_client, view.cooldown_holder)


def _settle(view: LeaseView, at: datetime) -> LeaseView:
    """End the current lease as expired if ``at`` is past its end and no event said so yet."""
    current = view.current
    if current is None or at < current.expires_at:
        return view
    cooldown = plus_seconds(current.expires_at, current.cooldown_seconds)
    return _ended(view, EXPIRED, current.expires_at, cooldown)


def _acquire(view: LeaseView, event: LeaseAcquired, recorded: Recorded) -> LeaseView:
    at = recorded.timestamp
    ttl = _seconds(event.ttl_seconds, 0, MAX_LEASE_SECONDS, zero=False)
    cooldown = _seconds(event.cooldown_seconds, 0, MAX_COOLDOWN_SECONDS, zero=True)
    if ttl is None or cooldown is None or not event.lease_id:
        return _ignored(view, UNUSABLE)
    timing = _timing(event.deadline, at)
    if timing != ON_TIME:
        return _ignored(view, timing)
    view = _settle(view, at)
    blocked = blocked_until(view.reports, target_key(event.target))
    if (
        view.current is not None
        or _resting(view, at, Claimant(client=event.client, holder=event.holder))
        or (blocked is not None and at < blocked)
    ):
        return msgspec.structs.replace(view, rejected=view.rejected + 1)
    # The grant's stream sequence: JetStream never reuses one, so the token keeps increasing
    # after older events age out of LEASE and on a replica that rebuilt from what is left
    # (docs/decisions/0080-fencing-tokens-are-the-grant-s.md). The floor keeps
    # tokens strictly increasing even on a log whose sequences do not (a hand-made one).
    token = max(recorded.seq, view.fencing_token + 1)
    # Only shown (``ttlClamped``); claims written before requests were bounded may hold any
    # number here, and none of them is a reason to refuse the claim.
    requested = _seconds(event.requested_ttl_seconds, 0, math.inf, zero=True) or 0.0
    record = LeaseRecord(
        lease_id=event.lease_id,
        proxy_uid=view.proxy_uid,
        holder=event.holder,
        client=event.client,
        acquired_at=at,
        expires_at=plus_seconds(at, ttl),
        ttl_seconds=ttl,
        requested_ttl_seconds=requested,
        fencing_token=token,
        selector=dict(event.selector),
        cooldown_seconds=cooldown,
        seq=recorded.seq,
    )
    return msgspec.structs.replace(
        view, current=record, fencing_token=token, granted=view.granted + 1
    )


def _release(view: LeaseView, event: LeaseReleased, at: datetime) -> LeaseView:
    cooldown = _seconds(event.cooldown_seconds, 0, MAX_COOLDOWN_SECONDS, zero=True)
    if cooldown is None:
        return _ignored(view, UNUSABLE)
    timing = _timing(event.deadline, at)
    if timing != ON_TIME:
        return _ignored(view, timing)
    current = view.current
    if current is None or current.lease_id != event.lease_id:
        return view  # an old lease, or one the fold refused: nothing to end
    if at >= current.expires_at:
        return _settle(view, at)  # released too late: it had expired already
    return _ended(view, RELEASED, at, plus_seconds(at, cooldown), event.reason)


def _expire(view: LeaseView, event: LeaseExpired, at: datetime) -> LeaseView:
    current = view.current
    if current is None or current.lease_id != event.lease_id or at < current.expires_at:
        return view  # stale, or premature (a writer whose clock runs ahead)
    return _settle(view, at)


def _renew(view: LeaseView, event: LeaseRenewed, recorded: Recorded) -> LeaseView:
    at = recorded.timestamp
    ttl = _seconds(event.ttl_seconds, 0, MAX_LEASE_SECONDS, zero=False)
    if ttl is None or not event.lease_id:
        return _ignored(view, UNUSABLE)
    timing = _timing(event.deadline, at)
    if timing != ON_TIME:
        return _ignored(view, timing)
    current = view.current
    if current is None or current.lease_id != event.lease_id:
        return view  # unknown, released, expired, or refused: nothing to renew
    if at >= current.expires_at:
        return _settle(view, at)  # renewed too late: it had expired already
    # Bounded by the grant, not by the renewal: a lease must not outlive its LeaseAcquired.
    expires = min(plus_seconds(at, ttl), plus_seconds(current.acquired_at, MAX_LEASE_SECONDS))
    requested = _seconds(event.requested_ttl_seconds, 0, math.inf, zero=True) or 0.0
    renewed = msgspec.structs.replace(
        current,
        expires_at=expires,
        ttl_seconds=ttl,
        requested_ttl_seconds=requested,
        renewed_at=at,
        renewed_seq=recorded.seq,
    )
    return msgspec.structs.replace(view, current=renewed)


def _report(view: LeaseView, event: LeaseReported, at: datetime) -> LeaseView:
    base = usable_base(event.backoff_seconds)
    if base is None:
        return _ignored(view, UNUSABLE)
    timing = _timing(event.deadline, at)
    if timing != ON_TIME:
        return _ignored(view, timing)
    reports = record(view.reports, event.outcome, event.target, base, at)
    view = msgspec.structs.replace(view, reports=reports)
    outcome = Outcome(
        lease_id=event.lease_id,
        outcome=event.outcome,
        detail=event.detail,
        target=event.target,
        at=at,
    )
    view = msgspec.structs.replace(view, outcomes=(*view.outcomes, outcome)[-HISTORY:])
    current = view.current
    if current is not None and current.lease_id == event.lease_id:
        updated = msgspec.structs.replace(current, outcomes=(*current.outcomes, outcome)[-HISTORY:])
        return msgspec.structs.replace(view, current=updated)
    recent = tuple(
        msgspec.structs.replace(r, outcomes=(*r.outcomes, outcome)[-HISTORY:])
        if r.lease_id == event.lease_id
        else r
        for r in view.recent
    )
    return msgspec.structs.replace(view, recent=recent)


def _switch(view: LeaseView, event: LeaseSwitched, recorded: Recorded) -> LeaseView:
    """The current lease moves to a rotation's replacement with a new, higher fencing token:
    the switch's stream sequence, as a grant's (D80). A switch of a lease that is not current,
    or already over at the switch's timestamp, changes nothing."""
    if not event.lease_id or not event.provider_id or not event.rotation_id:
        return _ignored(view, UNUSABLE)
    at = recorded.timestamp
    current = view.current
    if current is None or current.lease_id != event.lease_id:
        return view
    if at >= current.expires_at:
        return _settle(view, at)
    if current.rotation_id == event.rotation_id:
        return view  # the same switch twice: one new token
    token = max(recorded.seq, view.fencing_token + 1)
    switched = msgspec.structs.replace(
        current,
        fencing_token=token,
        rotation_id=event.rotation_id,
        provider_id=event.provider_id,
        switched_at=at,
    )
    return msgspec.structs.replace(view, current=switched, fencing_token=token)


def apply(view: LeaseView | None, recorded: Recorded) -> LeaseView:
    """Fold one event of ``lease.<uid>`` into the view (a new view; views are immutable)."""
    current = view or LeaseView(proxy_uid=proxy_uid_of(recorded.subject))
    at = recorded.timestamp
    match recorded.event:
        case LeaseAcquired() as event:
            current = _acquire(current, event, recorded)
        case LeaseReleased() as event:
            current = _release(current, event, at)
        case LeaseExpired() as event:
            current = _expire(current, event, at)
        case LeaseReported() as event:
            current = _report(current, event, at)
        case LeaseRenewed() as event:
            current = _renew(current, event, recorded)
        case LeaseSwitched() as event:
            current = _switch(current, event, recorded)
        case _:
            pass
    return msgspec.structs.replace(current, last_seq=recorded.seq, updated_at=at)


def fold(events: list[Recorded], view: LeaseView | None = None) -> LeaseView | None:
    for recorded in events:
        view = apply(view, recorded)
    return view
