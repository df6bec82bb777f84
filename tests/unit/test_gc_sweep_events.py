"""What a provider's GC round records (``services.gc.pure.report.sweep_events``), as a table:
found orphans, their deletes (ok or failed), leftovers in a scope of their own, and the summary
that closes every round. No providers, no log: the report is built as the sweep fills it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from events.schemas import InstanceState, OrphanDeleted, OrphanFound, SweepCompleted
from events.store import derive_msg_id
from services.gc.pure.report import LeftoverReport, ProviderReport, sweep_events
from services.gc.pure.rules import DeleteFailure
from services.providers.base import Instance, Leftover

T0 = datetime(2025, 6, 1, tzinfo=UTC)


def orphan(pid: str) -> Instance:
    return Instance(
        provider_id=pid, name=pid, state=InstanceState.RUNNING, owner_uid=f"o-{pid}", created_at=T0
    )


def failure(pid: str) -> DeleteFailure:
    return DeleteFailure(pid, f"o-{pid}", "Transient", "503")


def volume(pid: str) -> Leftover:
    return Leftover(provider_id=pid, owner_uid=f"o-{pid}", created_at=T0, kind="volume")


@dataclass(frozen=True)
class Round:
    name: str
    report: ProviderReport
    events: list[tuple[str, str, bool | None]]
    """(event type, provider id, ok for a delete) in order, the summary last (id "")."""


ROUNDS = [
    Round("nothing", ProviderReport("p", listed=3, young=1), [("SweepCompleted", "", None)]),
    Round(
        "skipped",
        ProviderReport("p", skipped=True, reason="Transient: 503"),
        [("SweepCompleted", "", None)],
    ),
    Round(
        "dry-run-found-only",
        ProviderReport("p", listed=2, orphans=[orphan("a"), orphan("b")]),
        [("OrphanFound", "a", None), ("OrphanFound", "b", None), ("SweepCompleted", "", None)],
    ),
    Round(
        "deleted-and-failed",
        ProviderReport(
            "p", listed=2, orphans=[orphan("a"), orphan("b")], deleted=["b"], failed=[failure("a")]
        ),
        [
            ("OrphanFound", "a", None),
            ("OrphanFound", "b", None),
            ("OrphanDeleted", "a", False),
            ("OrphanDeleted", "b", True),
            ("SweepCompleted", "", None),
        ],
    ),
    Round(
        "leftovers-after-instances-and-in-use-kept-silently",
        ProviderReport(
            "p",
            orphans=[orphan("a")],
            deleted=["a"],
            leftovers=LeftoverReport(
                listed=3, orphans=[volume("v1"), volume("v2")], deleted=["v1"], in_use=["v2"]
            ),
        ),
        [
            ("OrphanFound", "a", None),
            ("OrphanDeleted", "a", True),
            ("OrphanFound", "v1", None),
            ("OrphanFound", "v2", None),
            ("OrphanDeleted", "v1", True),
            ("SweepCompleted", "", None),
        ],
    ),
]


@pytest.mark.parametrize("row", ROUNDS, ids=lambda r: r.name)
def test_a_round_comes_to_its_events(row: Round) -> None:
    new = sweep_events(row.report, "s1")
    seen: list[tuple[str, str, bool | None]] = []
    for item in new:
        event = item.event
        match event:
            case OrphanFound():
                seen.append(("OrphanFound", event.provider_id, None))
            case OrphanDeleted():
                seen.append(("OrphanDeleted", event.provider_id, event.ok))
            case _:
                seen.append((type(event).__name__, "", None))
    assert seen == row.events
    summary = new[-1].event
    assert isinstance(summary, SweepCompleted)
    report = row.report
    assert (summary.listed, summary.orphans, summary.deleted, summary.failed) == (
        report.listed,
        len(report.orphans),
        len(report.deleted),
        len(report.failed),
    )
    assert (summary.skipped, summary.reason, summary.young) == (
        report.skipped,
        report.reason,
        report.young,
    )
    # Retried within the round, the same report appends under the same ids: stored once.
    assert [n.msg_id for n in sweep_events(row.report, "s1")] == [n.msg_id for n in new]
    assert len({n.msg_id for n in new}) == len(new)


def test_ids_derive_from_the_sweep_the_provider_and_the_instance() -> None:
    report = ProviderReport(
        "p", orphans=[orphan("x")], leftovers=LeftoverReport(orphans=[volume("x")])
    )
    ids = [n.msg_id for n in sweep_events(report, "s1")]
    assert ids == [
        derive_msg_id("gc", "s1", "p", "found", "x"),
        derive_msg_id("gc", "s1", "p", "found", "leftover", "x"),  # never an instance's id
        derive_msg_id("gc", "s1", "p", "completed"),
    ]
    assert sweep_events(report, "s2")[0].msg_id != ids[0]


def test_a_failed_delete_says_why() -> None:
    report = ProviderReport("p", orphans=[orphan("a")], failed=[failure("a")])
    deleted = sweep_events(report, "s1")[1].event
    assert isinstance(deleted, OrphanDeleted)
    assert (deleted.ok, deleted.error_class, deleted.error, deleted.kind) == (
        False,
        "Transient",
        "503",
        "instance",
    )
