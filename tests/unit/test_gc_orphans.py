"""The orphan decision as a table, and the sweep's failure handling over fake providers."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from events.schemas import InstanceState, ProxySpec
from services.gc.pure.rules import moment
from services.gc.sweep import EPOCH, Verdict, orphans, sweep_once, verdict
from services.providers.base import CreateRequest, Instance, Permanent, Transient
from services.testing.provider import FakeProvider

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
GRACE = 600.0


def instance(owner: str, age: float | None, pid: str = "i-1") -> Instance:
    created = EPOCH if age is None else NOW - timedelta(seconds=age)
    return Instance(
        provider_id=pid, name=pid, state=InstanceState.RUNNING, owner_uid=owner, created_at=created
    )


@pytest.mark.parametrize(
    ("owner", "age", "live", "expected"),
    [
        ("u1", 3600, {"u1"}, Verdict.LIVE),  # its proxy exists
        ("u1", 5, {"u1"}, Verdict.LIVE),
        ("u1", 3600, {"u2"}, Verdict.ORPHAN),  # owner gone, old
        ("u1", 3600, set(), Verdict.ORPHAN),
        ("u1", 599, set(), Verdict.YOUNG),  # a create in flight
        ("u1", 600, set(), Verdict.ORPHAN),  # the grace is exclusive at its end
        ("u1", -30, set(), Verdict.YOUNG),  # provider clock ahead: treated as new
        ("u1", None, set(), Verdict.ORPHAN),  # zero created_at counts as old
        ("", 3600, set(), Verdict.UNTAGGED),  # not tagged as ours
        ("", 3600, {""}, Verdict.UNTAGGED),
    ],
)
def test_verdict(owner: str, age: float | None, live: set[str], expected: Verdict) -> None:
    assert verdict(instance(owner, age), live, NOW, GRACE) is expected


def test_created_at_normalised() -> None:
    base = instance("u1", 0)
    naive = dataclasses.replace(base, created_at=datetime(2025, 6, 1, 11, 0))
    assert moment(naive.created_at) == datetime(2025, 6, 1, 11, 0, tzinfo=UTC)
    before_epoch = dataclasses.replace(base, created_at=datetime(1900, 1, 1, tzinfo=UTC))
    assert moment(before_epoch.created_at) == EPOCH
    missing = dataclasses.replace(base, created_at=None)  # type: ignore[arg-type]
    assert moment(missing.created_at) == EPOCH


def test_orphans_keeps_listing_order() -> None:
    listed = [
        instance("gone-1", 3600, "a"),
        instance("live", 3600, "b"),
        instance("gone-2", 10, "c"),
        instance("gone-3", 7200, "d"),
    ]
    assert [i.provider_id for i in orphans(listed, {"live"}, NOW, GRACE)] == ["a", "d"]


async def _made(provider: FakeProvider, name: str, owner: str) -> str:
    return await provider.create(
        CreateRequest(name=name, owner_uid=owner, namespace="ns", proxy_name=name, spec=ProxySpec())
    )


async def test_listing_failure_skips_only_that_provider() -> None:
    broken, healthy = FakeProvider("broken"), FakeProvider("healthy")
    await _made(broken, "x", "gone")
    await _made(healthy, "y", "gone")
    broken.inject("list", Transient("api down"))
    report = await sweep_once(
        {"broken": broken, "healthy": healthy}, set(), datetime.now(UTC) + timedelta(hours=1), 60
    )
    by_name = {p.provider: p for p in report.providers}
    assert by_name["broken"].skipped
    assert "api down" in by_name["broken"].reason
    assert by_name["broken"].orphans == []
    assert "fake-x" in broken.instances
    assert by_name["healthy"].deleted == ["fake-y"]
    assert not healthy.instances
    assert report.skipped == ["broken"]


async def test_failed_delete_does_not_stop_the_rest() -> None:
    fake = FakeProvider("fake")
    for name in ("a", "b", "c"):
        await _made(fake, name, f"owner-{name}")
    fake.inject("delete", Permanent("forbidden"))
    later = datetime.now(UTC) + timedelta(hours=1)
    report = await sweep_once({"fake": fake}, set(), later, 60, concurrency=1)
    entry = report.providers[0]
    assert len(entry.orphans) == 3
    assert [f.provider_id for f in entry.failed] == ["fake-a"]
    assert entry.failed[0].error_class == "Permanent"
    assert entry.deleted == ["fake-b", "fake-c"]
    assert report.deleted == 2
    assert report.failed == 1
    assert list(fake.instances) == ["fake-a"]


async def test_dry_run_deletes_nothing_and_live_source_is_read_after_listing() -> None:
    fake = FakeProvider("fake")
    await _made(fake, "a", "u-a")
    order: list[str] = []

    async def live() -> set[str]:
        order.append("live")
        return set()

    original = fake.list_by_tag

    async def listing() -> list[Instance]:
        order.append("list")
        return await original()

    fake.list_by_tag = listing  # type: ignore[method-assign]
    later = datetime.now(UTC) + timedelta(hours=1)
    report = await sweep_once({"fake": fake}, live, later, 60, dry_run=True)
    assert order == ["list", "live"]
    assert [i.provider_id for i in report.providers[0].orphans] == ["fake-a"]
    assert report.deleted == 0
    assert "fake-a" in fake.instances
    assert ("delete", "fake-a") not in fake.calls
