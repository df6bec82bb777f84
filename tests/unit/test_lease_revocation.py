"""When the system ends a lease under its holder (D139): a proxy being deleted or removed, or a
member that no longer carries the pool the lease came from; never a proxy merely unknown to a
view that may be behind. The fold keeps the reason the release carried, and the holder is told
it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from events.schemas import LeaseAcquired, LeaseReleased, ProxySpec
from events.store import Recorded
from projections.lease import RELEASED, LeaseRecord, fold
from projections.proxy import ProxyView
from services.discovery.pure.revocation import (
    LEFT_POOL,
    PROXY_DELETED,
    revoked_message,
    why_revoked,
)

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def _record(selector: dict[str, str]) -> LeaseRecord:
    return LeaseRecord(
        lease_id="l1",
        proxy_uid="p1",
        acquired_at=T0,
        expires_at=T0 + timedelta(minutes=5),
        ttl_seconds=300.0,
        fencing_token=1,
        selector=selector,
    )


def _proxy(
    attributes: dict[str, str], *, deleting: bool = False, removed: bool = False
) -> ProxyView:
    spec = ProxySpec(provider="local", attributes=attributes)
    return ProxyView(
        uid="p1",
        namespace="crawl",
        name="depool-x",
        spec=spec,
        deleting=deleting,
        removed=removed,
    )


def test_a_proxy_going_away_ends_its_lease() -> None:
    record = _record({"pool": "depool"})
    member = {"pool": "depool", "country": "de"}
    assert why_revoked(_proxy(member), record) == ""
    assert why_revoked(_proxy(member, deleting=True), record) == PROXY_DELETED
    assert why_revoked(_proxy(member, removed=True, deleting=True), record) == PROXY_DELETED
    assert why_revoked(_proxy({"country": "de"}), record) == LEFT_POOL
    assert why_revoked(_proxy({"pool": "other"}), record) == LEFT_POOL
    assert why_revoked(None, record) == ""  # not in this view (yet): no reason


def test_a_lease_without_a_pool_ends_only_with_its_proxy() -> None:
    record = _record({"country": "de"})
    assert why_revoked(_proxy({"country": "fr"}), record) == ""
    assert why_revoked(_proxy({}, deleting=True), record) == PROXY_DELETED


def test_the_fold_keeps_the_reason_and_the_holder_is_told_it() -> None:
    events: list[LeaseAcquired | LeaseReleased] = [
        LeaseAcquired(
            lease_id="l1", proxy_uid="p1", ttl_seconds=300.0, selector={"pool": "depool"}
        ),
        LeaseReleased(lease_id="l1", proxy_uid="p1", reason=LEFT_POOL),
    ]
    view = fold(
        [
            Recorded(subject="lease.p1", seq=i + 1, event=e, timestamp=T0 + timedelta(seconds=i))
            for i, e in enumerate(events)
        ]
    )
    assert view is not None
    assert view.current is None
    (ended,) = view.recent
    assert (ended.end, ended.reason) == (RELEASED, LEFT_POOL)
    message = revoked_message(ended)
    assert "p1" in message
    assert "no longer a member of the pool 'depool'" in message
    deleted = msgspec.structs.replace(ended, reason=PROXY_DELETED)
    assert "is being deleted" in revoked_message(deleted)
