"""``POST /v1/leases/{id}/rotate``: the holder asks for a fresh instance (a fresh IP) of its
proxy, without downtime (docs/api.md; docs/decisions/0085-a-fresh-ip-without-downtime.md).

The request becomes a ``RotationRequested`` on ``proxy.<uid>.rotate``, appended with the
proxy aggregate's expected last sequence, so two requests (on one replica or two) cannot both
start a rotation: the second conflicts, reads the proxy again, and answers with the rotation
the first started. The reconciler does the rest: it makes the replacement, the health service
probes it, the reconciler promotes it and switches the lease (a new fencing token), and only
then deletes the old instance. The answer is given once this replica's view shows the request,
so a ``GET`` right after sees the rotation; the lease's ``proxy`` changes when it switches.

``GET /v1/leases/{id}/rotation`` answers the latest rotation of the lease's proxy for that lease,
so a holder (the CLI's ``lease rotate --wait``, the client library) can wait for the switch.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from events import subjects
from events.errors import ConcurrencyError, StoreUnavailable
from events.schemas import ProxyMode, RotationRequested
from events.store import NewEvent, derive_msg_id
from projections.lease import LeaseRecord
from projections.proxy import COMPLETED, ProxyView, Rotation, fold
from services.discovery.http.errors import ApiError, Unavailable
from services.discovery.http.models import LeaseOut
from services.discovery.leasing.leases import Leases
from services.discovery.pure.errorcodes import ErrorCode
from services.discovery.pure.policy import Granted


class NotRotatable(ApiError):
    """The lease is active but its proxy cannot get a fresh instance (being deleted, or an
    External proxy, whose address is not ours to change)."""

    code = ErrorCode.NOT_ROTATABLE


class NoRotation(ApiError):
    """The lease is active but never asked for a rotation (or its proxy's latest rotation was
    another lease's)."""

    code = ErrorCode.NO_ROTATION


SWITCHING = "switching"
"""Promoted but this lease not switched yet (milliseconds): its ``proxy`` may show the new URL
with the old ``fencingToken``. ``completed`` waits for the switch, so that a holder that takes
the lease of a ``completed`` rotation has the new token
(docs/decisions/0088-waiting-for-a-rotation-a-read.md)."""


class RotationOut(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    rotation_id: str
    state: str
    """``requested``, ``creating``, ``probing``, ``switching`` (under way), ``completed``,
    ``failed`` or ``cancelled``."""
    reason: str
    """``Requested`` (a holder asked) or ``SpecChanged`` (the proxy's spec changed while it was
    leased); "" until the reconciler starts it."""
    message: str
    """Why it failed or was cancelled."""
    requested_at: datetime | None
    ended_at: datetime | None
    lease: LeaseOut
    """The lease as it is now: its ``proxy`` and ``fencingToken`` change at the switch."""


def rotation_out(rotation: Rotation, lease: LeaseOut) -> RotationOut:
    return RotationOut(
        rotation_id=rotation.rotation_id,
        state=rotation.state,
        reason=rotation.reason,
        message=rotation.message,
        requested_at=rotation.requested_at,
        ended_at=rotation.ended_at,
        lease=lease,
    )


def as_seen_by(rotation: Rotation, record: LeaseRecord) -> Rotation:
    """The rotation as the lease sees it: ``completed`` once the lease has switched to its
    replacement, ``switching`` between the promotion and the switch. The proxy and the lease are
    two views that catch up separately; either may show the switch first. A rotation satisfied
    by a delete-first replacement (no ``reason``: none was started) never switches a lease."""
    replace = msgspec.structs.replace
    if record.rotation_id and record.rotation_id == rotation.rotation_id:
        if rotation.state == COMPLETED:
            return rotation
        return replace(rotation, state=COMPLETED, ended_at=rotation.ended_at or record.switched_at)
    if rotation.state == COMPLETED and rotation.reason:
        return replace(rotation, state=SWITCHING, ended_at=None)
    return rotation


def checked_proxy(proxy: ProxyView | None, lease_id: str) -> ProxyView:
    """The proxy, if a rotation can give it a fresh instance; else `not_rotatable`."""
    if proxy is None or proxy.removed or proxy.deleting:
        raise NotRotatable(f"the proxy of lease {lease_id!r} is being deleted; release the lease")
    if proxy.spec.mode is ProxyMode.EXTERNAL:
        raise NotRotatable(
            f"the proxy of lease {lease_id!r} is External: its address is not ours to change"
        )
    return proxy


async def rotate(leases: Leases, lease_id: str, *, client: str = "") -> tuple[Rotation, Granted]:
    """Start a rotation of the lease's proxy, or find the one under way (the same answer:
    asking again is safe). 404 ``unknown_lease`` unless the lease is active."""
    granted = await leases.current(lease_id)
    uid = granted.view.proxy_uid
    store, views, policy = leases.store, leases.views, leases.policy
    aggregate = subjects.proxy(uid)
    for _ in range(policy.max_attempts):
        # The log, not the view: the request must not start a second rotation because this
        # replica's view lags behind one another replica started.
        history = await store.read(aggregate)
        proxy = checked_proxy(fold(list(history.events)), lease_id)
        if proxy.rotation is not None and proxy.rotation.in_progress:
            granted = leases.get(lease_id)
            return as_seen_by(proxy.rotation, granted.record), granted
        rotation_id = "rot-" + derive_msg_id("rotation", uid, lease_id, str(history.last_seq))[:20]
        event = RotationRequested(
            uid=uid, rotation_id=rotation_id, lease_id=lease_id, client=client
        )
        try:
            result = await store.append(
                aggregate,
                [NewEvent(event, derive_msg_id("rotation-requested", rotation_id))],
                expected_seq=history.last_seq,
            )
        except ConcurrencyError:
            continue  # the proxy moved (a probe, another request): look again
        try:
            await views.proxies.wait_for(result.last_seq, policy.view_timeout)
        except TimeoutError:
            raise StoreUnavailable(f"the view did not reach sequence {result.last_seq}") from None
        shown = views.proxy(uid)
        rotation = shown.rotation if shown is not None else None
        if rotation is None:
            rotation = Rotation(rotation_id=rotation_id, lease_id=lease_id)
        granted = leases.get(lease_id)
        return as_seen_by(rotation, granted.record), granted
    raise Unavailable(
        f"the proxy of lease {lease_id!r} kept changing while the rotation was asked for; "
        "try again",
        headers={"Retry-After": "1"},
    )


async def latest(leases: Leases, lease_id: str) -> tuple[Rotation, Granted]:
    """The latest rotation of the lease's proxy for this lease. 404 ``unknown_lease`` unless the
    lease is active, 404 ``no_rotation`` if it never asked for one (or one was asked for since
    by a later holder). Before answering ``no_rotation`` the proxy view catches up with the log
    (bounded): the rotation may have been asked for on another replica a moment ago."""
    granted = await leases.current(lease_id)
    uid = granted.view.proxy_uid
    rotation = _rotation_of(leases, granted)
    if rotation is None:
        try:
            history = await leases.store.read(subjects.proxy(uid))
            await leases.views.proxies.wait_for(history.last_seq, leases.policy.view_timeout)
        except (StoreUnavailable, TimeoutError):
            pass  # answer from the view as it is
        granted = leases.get(lease_id)
        rotation = _rotation_of(leases, granted)
    if rotation is None:
        raise NoRotation(
            f"lease {lease_id!r} has not asked for a rotation; POST /v1/leases/{{id}}/rotate "
            "starts one"
        )
    return as_seen_by(rotation, granted.record), granted


def _rotation_of(leases: Leases, granted: Granted) -> Rotation | None:
    """The proxy's latest rotation if it is this lease's: asked for by it, or started by a spec
    change (no lease named) while it held the proxy, which switches it all the same."""
    proxy = leases.views.proxy(granted.view.proxy_uid)
    rotation = proxy.rotation if proxy is not None else None
    if rotation is None:
        return None
    record = granted.record
    if rotation.lease_id:
        return rotation if rotation.lease_id == record.lease_id else None
    at = rotation.requested_at
    return rotation if at is not None and at >= record.acquired_at else None
