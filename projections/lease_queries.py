"""The questions asked of a lease view (``projections.lease``): is the proxy free or available,
when will it be, which lease holds it; and the index by lease id that lets ``find`` be asked
of the right proxy's view. Pure: "now" is always the caller's argument.

Whether a proxy is available depends on who asks: the rest after a lease is not its own
client's (``projections.cooldown``, D153). Asked with a ``who``, the answers are that
claimant's, as the fold will judge its claim; without one, anybody else's (the fleet's counts
and listings).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from datetime import datetime

from events.schemas import Phase
from events.store import Recorded
from projections.cooldown import Claimant, follows
from projections.lease import ACTIVE, EXPIRED, LeaseRecord, LeaseView, apply, plus_seconds
from projections.outcomes import blocked_until
from projections.proxy import ProxyView


def leasable(proxy: ProxyView) -> bool:
    """Ready, not being deleted, with an address, and found healthy by the health service.

    A proxy not probed yet (``healthy`` None) is not leased: the probe is what tells a proxy
    that is up from one that forwards traffic, and the health service records its first verdict
    about a second after the proxy turns Ready.
    """
    return (
        proxy.phase is Phase.READY
        and not proxy.deleting
        and not proxy.removed
        and bool(proxy.url)
        and proxy.healthy is True
    )


def is_free(view: LeaseView | None, now: datetime) -> bool:
    """No lease holds the proxy at ``now`` (cooldown aside)."""
    return view is None or view.current is None or now >= view.current.expires_at


def available_at(
    view: LeaseView | None, target: str = "", who: Claimant | None = None
) -> datetime | None:
    """The earliest time the proxy can be leased again (for ``target``, a ``target_key``, if
    given: past its back-off for it too; by ``who``, if given: without a rest of its own);
    None when nothing stands in the way."""
    if view is None:
        return None
    current = view.current
    if current is not None:
        own = follows(who, current.client, current.holder)
        rest = 0.0 if own else current.cooldown_seconds
        when: datetime | None = plus_seconds(current.expires_at, rest)
    elif follows(who, view.cooldown_client, view.cooldown_holder):
        when = None
    else:
        when = view.cooldown_until
    blocked = blocked_until(view.reports, target)
    if blocked is not None and (when is None or blocked > when):
        return blocked
    return when


def is_available(
    view: LeaseView | None, now: datetime, target: str = "", who: Claimant | None = None
) -> bool:
    """Free, past its cooldown (one not ``who``'s own) and (for ``target``) its back-off at
    ``now``: a claim stamped ``now`` (by ``who``) would hold."""
    when = available_at(view, target, who)
    return when is None or now >= when


def state_of(record: LeaseRecord, now: datetime) -> str:
    if record.end:
        return record.end
    return EXPIRED if now >= record.expires_at else ACTIVE


def active(view: LeaseView | None, lease_id: str, now: datetime) -> LeaseRecord | None:
    """The lease with this id if it holds its proxy at ``now``; None once it has ended (released
    or expired, recorded or not) or when the view does not know it."""
    if view is None or view.current is None or view.current.lease_id != lease_id:
        return None
    return view.current if now < view.current.expires_at else None


def find(view: LeaseView | None, lease_id: str) -> LeaseRecord | None:
    """The lease with this id, if the view still holds it (the current one or a recent one)."""
    if view is None:
        return None
    if view.current is not None and view.current.lease_id == lease_id:
        return view.current
    return next((r for r in reversed(view.recent) if r.lease_id == lease_id), None)


def lease_ids(view: LeaseView | None) -> set[str]:
    if view is None:
        return set()
    ids = {r.lease_id for r in view.recent}
    if view.current is not None:
        ids.add(view.current.lease_id)
    return ids


Apply = Callable[[LeaseView | None, Recorded], LeaseView]


def indexed(index: MutableMapping[str, str]) -> Apply:
    """``apply`` that also keeps ``index`` (lease id -> proxy uid) in step with the views: a
    lease is findable by id for as long as its proxy's view holds it (``find``)."""

    def apply_and_index(view: LeaseView | None, recorded: Recorded) -> LeaseView:
        after = apply(view, recorded)
        before_ids, after_ids = lease_ids(view), lease_ids(after)
        for gone in before_ids - after_ids:
            # Only this proxy's entry: a lease id reused on another proxy (an Idempotency-Key
            # sent again long after its lease ended) keeps its own.
            if index.get(gone) == after.proxy_uid:
                del index[gone]
        for new in after_ids - before_ids:
            index[new] = after.proxy_uid
        return after

    return apply_and_index
