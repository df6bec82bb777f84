"""Leftovers in the sweep (what a provider made for an instance and left behind without it): the
same rules as instances, over a fake provider that has them; their events, the instrumented
wrapper that keeps the capability, and how ``gc run-once`` shows them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from events.schemas import OrphanDeleted, OrphanFound, ProxySpec, SweepCompleted
from services.cli.admin.gc_cmd import as_json, summary, table
from services.gc.pure.report import sweep_events
from services.gc.sweep import EPOCH, SweepReport, sweep_once
from services.providers.base import (
    CreateRequest,
    Leftover,
    LeftoverCleaner,
    NotFound,
    Permanent,
    Transient,
)
from services.providers.instrumented import Instrumented, InstrumentedCleaner, instrument
from services.runtime.observability.metrics import Metrics
from services.testing.provider import FakeProvider, FakeProviderWithLeftovers

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
HOUR_AGO = NOW - timedelta(hours=1)
GRACE = 600.0


def vol(name: str) -> str:
    return f"hosts/hv1/volumes/default/{name}"


@pytest.fixture
def fake() -> FakeProviderWithLeftovers:
    """One leftover of each verdict: a live owner's, a young one, an untagged one, and two
    orphans (one of an owner whose uid the provider lowercased)."""
    provider = FakeProviderWithLeftovers("kvm")
    provider.leave(vol("live.qcow2"), "u-live", HOUR_AGO)
    provider.leave(vol("folded.qcow2"), "u-mixed", HOUR_AGO)  # the owner is live as "U-Mixed"
    provider.leave(vol("young.qcow2"), "u-young", NOW - timedelta(seconds=GRACE - 1))
    provider.leave(vol("theirs.qcow2"), "", HOUR_AGO)
    provider.leave(vol("gone.qcow2"), "u-gone", HOUR_AGO)
    provider.leave(vol("unknown-age.iso"), "u-gone", EPOCH, kind="seed")
    return provider


LIVE = frozenset({"u-live", "U-Mixed"})
ORPHANS = [vol("gone.qcow2"), vol("unknown-age.iso")]


async def test_only_orphaned_leftovers_are_deleted(fake: FakeProviderWithLeftovers) -> None:
    report = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE)
    left = report.providers[0].leftovers
    assert left is not None
    assert left.listed == 6
    assert [lo.provider_id for lo in left.orphans] == ORPHANS
    assert left.young == 1
    assert left.deleted == ORPHANS
    assert (left.in_use, left.failed, left.skipped) == ([], [], False)
    assert set(fake.left) == {
        vol("live.qcow2"),
        vol("folded.qcow2"),
        vol("young.qcow2"),
        vol("theirs.qcow2"),
    }
    assert (report.leftovers, report.leftovers_deleted, report.leftovers_failed) == (2, 2, 0)
    # Leftovers are not instances: the instance counts stay theirs.
    assert (report.orphans, report.deleted) == (0, 0)


async def test_the_grace_counts_from_the_leftovers_time(fake: FakeProviderWithLeftovers) -> None:
    report = await sweep_once({"kvm": fake}, LIVE, NOW + timedelta(seconds=1), GRACE)
    left = report.providers[0].leftovers
    assert left is not None
    assert vol("young.qcow2") in left.deleted
    assert left.young == 0


async def test_a_leftover_in_use_again_is_kept_not_counted_deleted(
    fake: FakeProviderWithLeftovers,
) -> None:
    listed = await fake.leftovers()
    # Its instance comes back between the listing and the delete (a create resumed).
    original = fake.leftovers

    async def then_reused() -> list[Leftover]:
        found = await original()
        fake.reuse(vol("gone.qcow2"))
        return found

    fake.leftovers = then_reused  # type: ignore[method-assign]
    report = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE)
    left = report.providers[0].leftovers
    assert left is not None
    assert len(listed) == 6
    assert left.in_use == [vol("gone.qcow2")]
    assert left.deleted == [vol("unknown-age.iso")]
    assert report.leftovers_deleted == 1
    assert vol("gone.qcow2") in fake.left
    kinds = {type(e.event).__name__: e.event for e in sweep_events(report.providers[0], "s1")}
    completed = kinds["SweepCompleted"]
    assert isinstance(completed, SweepCompleted)
    assert (completed.leftovers, completed.leftovers_deleted) == (2, 1)
    assert completed.leftovers_in_use == 1


async def test_failing_leftovers_skip_only_the_leftovers() -> None:
    fake = FakeProviderWithLeftovers("kvm")
    pid = await fake.create(
        CreateRequest(
            name="i", owner_uid="u-gone", namespace="ns", proxy_name="i", spec=ProxySpec()
        )
    )
    fake.leave(vol("gone.qcow2"), "u-gone", HOUR_AGO)
    fake.inject("leftovers", Transient("pool scan timed out"))
    report = await sweep_once({"kvm": fake}, set(), datetime.now(UTC) + timedelta(hours=1), 60)
    entry = report.providers[0]
    assert entry.deleted == [pid]  # the instances are swept as ever
    assert not entry.skipped
    assert entry.leftovers is not None
    assert entry.leftovers.skipped
    assert "pool scan timed out" in entry.leftovers.reason
    assert entry.leftovers.orphans == []
    assert vol("gone.qcow2") in fake.left
    assert not [c for c in fake.calls if c[0] == "delete_leftover"]
    assert report.leftovers_skipped == ["kvm"]
    (completed,) = [
        e.event for e in sweep_events(entry, "s1") if isinstance(e.event, SweepCompleted)
    ]
    assert isinstance(completed, SweepCompleted)
    assert "pool scan timed out" in completed.leftovers_reason
    assert not completed.skipped


async def test_a_failed_listing_lists_no_leftovers(fake: FakeProviderWithLeftovers) -> None:
    fake.inject("list", Transient("api down"))
    report = await sweep_once({"kvm": fake}, set(), NOW, GRACE)
    assert report.skipped == ["kvm"]
    assert report.providers[0].leftovers is None
    assert [op for op, _ in fake.calls] == ["list"]
    assert len(fake.left) == 6


async def test_delete_failures_and_already_gone(fake: FakeProviderWithLeftovers) -> None:
    fake.inject("delete_leftover", Permanent("volume is busy"))
    fake.inject("delete_leftover", NotFound("gone already"))
    report = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE, concurrency=1)
    left = report.providers[0].leftovers
    assert left is not None
    assert [(f.provider_id, f.error_class) for f in left.failed] == [
        (vol("gone.qcow2"), "Permanent")
    ]
    assert "volume is busy" in left.failed[0].error
    assert left.deleted == [vol("unknown-age.iso")]  # NotFound: the goal is reached
    assert report.leftovers_failed == 1
    events = [e.event for e in sweep_events(report.providers[0], "s1")]
    results = {e.provider_id: e for e in events if isinstance(e, OrphanDeleted)}
    assert not results[vol("gone.qcow2")].ok
    assert results[vol("gone.qcow2")].error_class == "Permanent"
    assert results[vol("unknown-age.iso")].ok


async def test_dry_run_deletes_no_leftovers(fake: FakeProviderWithLeftovers) -> None:
    report = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE, dry_run=True)
    left = report.providers[0].leftovers
    assert left is not None
    assert [lo.provider_id for lo in left.orphans] == ORPHANS
    assert left.deleted == []
    assert len(fake.left) == 6
    assert not [c for c in fake.calls if c[0] == "delete_leftover"]


async def test_a_provider_without_the_capability_is_swept_as_before() -> None:
    plain = FakeProvider("plain")
    assert not isinstance(plain, LeftoverCleaner)
    report = await sweep_once({"plain": plain}, set(), NOW, GRACE)
    assert report.providers[0].leftovers is None
    assert report.leftovers == 0
    completed = sweep_events(report.providers[0], "s1")[-1].event
    assert isinstance(completed, SweepCompleted)
    assert (completed.leftovers, completed.leftovers_reason) == (0, "")


async def test_events_carry_the_kind(fake: FakeProviderWithLeftovers) -> None:
    pid = await fake.create(
        CreateRequest(
            name="i", owner_uid="u-gone", namespace="ns", proxy_name="i", spec=ProxySpec()
        )
    )
    report = await sweep_once({"kvm": fake}, LIVE, datetime.now(UTC) + timedelta(hours=1), GRACE)
    new_events = sweep_events(report.providers[0], "s1")
    assert len({e.msg_id for e in new_events}) == len(new_events)
    events = [e.event for e in new_events]
    found = {e.provider_id: e.kind for e in events if isinstance(e, OrphanFound)}
    deleted = {e.provider_id: e.kind for e in events if isinstance(e, OrphanDeleted)}
    expected = {pid: "instance", vol("gone.qcow2"): "volume", vol("unknown-age.iso"): "seed"}
    # The young one is an orphan an hour later, too.
    expected[vol("young.qcow2")] = "volume"
    assert found == expected
    assert deleted == expected
    completed = events[-1]
    assert isinstance(completed, SweepCompleted)
    assert (completed.orphans, completed.deleted, completed.leftovers) == (1, 1, 3)
    assert completed.leftovers_deleted == 3
    gc_types = OrphanFound | OrphanDeleted | SweepCompleted
    assert all(isinstance(e, gc_types) and e.sweep_id == "s1" for e in events)


# ------------------------------------------------------------------------- instrumented


@pytest.fixture
def exporter(spans: InMemorySpanExporter) -> InMemorySpanExporter:
    return spans


def test_instrument_keeps_the_capability_only_when_the_provider_has_it() -> None:
    metrics = Metrics()
    wrapped = instrument(FakeProviderWithLeftovers("kvm"), metrics)
    assert isinstance(wrapped, InstrumentedCleaner)
    assert isinstance(wrapped, LeftoverCleaner)
    plain = instrument(FakeProvider("plain"), metrics)
    assert type(plain) is Instrumented
    assert not isinstance(plain, LeftoverCleaner)
    with pytest.raises(TypeError, match="instrument"):
        InstrumentedCleaner(FakeProvider("plain"), metrics)


async def test_instrumented_leftover_calls_are_spans_and_metrics(
    fake: FakeProviderWithLeftovers, exporter: InMemorySpanExporter
) -> None:
    metrics = Metrics()
    wrapped = instrument(fake, metrics)
    report = await sweep_once({"kvm": wrapped}, LIVE, NOW, GRACE)
    assert report.leftovers_deleted == 2
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans].count("provider.leftovers") == 1
    deletes = [s for s in spans if s.name == "provider.delete_leftover"]
    assert len(deletes) == 2
    assert all(s.kind is SpanKind.CLIENT for s in deletes)
    assert {s.attributes["provider.instance"] for s in deletes if s.attributes} == set(ORPHANS)
    fake.inject("leftovers", Permanent("denied"))
    assert isinstance(wrapped, InstrumentedCleaner)
    with pytest.raises(Permanent):
        await wrapped.leftovers()

    def sample(op: str, result: str) -> float | None:
        return metrics.registry.get_sample_value(
            "egress_provider_requests_total", {"provider": "kvm", "op": op, "result": result}
        )

    assert sample("leftovers", "ok") == 1.0
    assert sample("leftovers", "Permanent") == 1.0
    assert sample("delete_leftover", "ok") == 2.0


# ------------------------------------------------------------------------- gc run-once


async def _dry_and_real(fake: FakeProviderWithLeftovers) -> tuple[SweepReport, SweepReport]:
    dry = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE, dry_run=True)
    fake.inject("delete_leftover", Transient("link down"))
    real = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE, concurrency=1)
    return dry, real


async def test_run_once_shows_leftovers(fake: FakeProviderWithLeftovers) -> None:
    dry, real = await _dry_and_real(fake)
    dry_rows = as_json(dry)["providers"]
    assert isinstance(dry_rows, list)
    dry_left = dry_rows[0]["leftovers"]
    assert [(o["providerId"], o["kind"], o["result"]) for o in dry_left["orphans"]] == [
        (vol("gone.qcow2"), "volume", "would delete"),
        (vol("unknown-age.iso"), "seed", "would delete"),
    ]
    assert "leftovers: would delete 2" in summary(dry)
    real_rows = as_json(real)["providers"]
    assert isinstance(real_rows, list)
    real_left = real_rows[0]["leftovers"]
    assert [o["result"] for o in real_left["orphans"]] == [
        "failed: Transient: link down",
        "deleted",
    ]
    assert (real_left["deleted"], real_left["failed"]) == (1, 1)
    assert "leftovers: deleted 1 of 2 (1 failed)" in summary(real)
    columns = [c.header for c in table(real).columns]
    assert columns == ["PROVIDER", "KIND", "INSTANCE", "OWNER", "AGE", "RESULT"]
    kinds = [str(cell) for cell in table(real).columns[1].cells]
    ids = [str(cell) for cell in table(real).columns[2].cells]
    assert list(zip(kinds, ids, strict=True)) == [
        ("volume", vol("gone.qcow2")),
        ("seed", vol("unknown-age.iso")),
    ]


async def test_run_once_shows_skipped_leftovers(fake: FakeProviderWithLeftovers) -> None:
    fake.inject("leftovers", Transient("pool scan timed out"))
    report = await sweep_once({"kvm": fake}, LIVE, NOW, GRACE)
    results = [str(cell) for cell in table(report).columns[5].cells]
    assert results == ["leftovers skipped: Transient: pool scan timed out"]
    rows = as_json(report)["providers"]
    assert isinstance(rows, list)
    assert rows[0]["leftovers"]["skipped"]
    assert "1 providers' leftovers skipped" in summary(report)
