"""What one GC round found and did, and the ``GC`` events it comes to.

Plain values: the sweep (``services.gc.sweep``, ``leftovers``) fills the reports as it lists and
deletes; ``sweep_events`` turns a provider's report into the events the collector appends
(``services.gc.collector``), so what a round records is tested as a table, without providers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from events.schemas import Event, OrphanDeleted, OrphanFound, SweepCompleted
from events.store import NewEvent, derive_msg_id
from services.gc.pure.rules import DeleteFailure
from services.providers.base import Instance, Leftover


@dataclass
class LeftoverReport:
    """What one provider's round found and did about its leftovers."""

    listed: int = 0
    orphans: list[Leftover] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    in_use: list[str] = field(default_factory=list)
    """Orphans the provider kept at delete time because they are in use again."""
    failed: list[DeleteFailure] = field(default_factory=list)
    young: int = 0
    skipped: bool = False
    reason: str = ""
    found: list[Leftover] = field(default_factory=list, repr=False)
    """The whole listing, until ``judge_leftovers`` picks the orphans."""


@dataclass
class ProviderReport:
    """What one provider's round found and did."""

    provider: str
    listed: int = 0
    orphans: list[Instance] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    failed: list[DeleteFailure] = field(default_factory=list)
    young: int = 0
    skipped: bool = False
    reason: str = ""
    leftovers: LeftoverReport | None = None
    """None when the provider has no leftovers to clean, or its listing failed."""


@dataclass
class SweepReport:
    now: datetime
    grace: float
    dry_run: bool
    providers: list[ProviderReport] = field(default_factory=list)

    @property
    def deleted(self) -> int:
        return sum(len(p.deleted) for p in self.providers)

    @property
    def orphans(self) -> int:
        return sum(len(p.orphans) for p in self.providers)

    @property
    def failed(self) -> int:
        return sum(len(p.failed) for p in self.providers)

    @property
    def skipped(self) -> list[str]:
        return [p.provider for p in self.providers if p.skipped]

    def _leftovers(self) -> list[LeftoverReport]:
        return [p.leftovers for p in self.providers if p.leftovers is not None]

    @property
    def leftovers(self) -> int:
        """Orphaned leftovers found."""
        return sum(len(r.orphans) for r in self._leftovers())

    @property
    def leftovers_deleted(self) -> int:
        return sum(len(r.deleted) for r in self._leftovers())

    @property
    def leftovers_failed(self) -> int:
        return sum(len(r.failed) for r in self._leftovers())

    @property
    def leftovers_skipped(self) -> list[str]:
        """Providers whose leftovers could not be listed this round."""
        return [p.provider for p in self.providers if p.leftovers and p.leftovers.skipped]


@dataclass(frozen=True, slots=True)
class _Found:
    """An orphan instance or leftover, as its events need it."""

    provider_id: str
    owner_uid: str
    created_at: datetime
    kind: str


def sweep_events(report: ProviderReport, sweep_id: str) -> list[NewEvent]:
    """A provider's round as events; ids derive from the sweep and the instance (or leftover),
    so a retried append within the round is stored once. Leftovers are ``OrphanFound`` /
    ``OrphanDeleted`` with their ``kind``; one kept because it is in use again gets no
    ``OrphanDeleted`` (nothing was attempted that a later sweep would retry)."""

    def new(event: Event, *parts: str) -> NewEvent:
        return NewEvent(event, derive_msg_id("gc", sweep_id, report.provider, *parts))

    def orphan_events(
        found: list[_Found], deleted: list[str], failed: list[DeleteFailure], *scope: str
    ) -> list[NewEvent]:
        events = [
            new(
                OrphanFound(
                    provider=report.provider,
                    provider_id=f.provider_id,
                    owner_uid=f.owner_uid,
                    created_at=f.created_at.isoformat(),
                    sweep_id=sweep_id,
                    kind=f.kind,
                ),
                "found",
                *scope,
                f.provider_id,
            )
            for f in found
        ]
        failures = {f.provider_id: f for f in failed}
        done = set(deleted)
        for f in found:
            failure = failures.get(f.provider_id)
            if failure is None and f.provider_id not in done:
                continue
            result = OrphanDeleted(
                provider=report.provider,
                provider_id=f.provider_id,
                owner_uid=f.owner_uid,
                sweep_id=sweep_id,
                ok=failure is None,
                error_class=failure.error_class if failure else "",
                error=failure.error if failure else "",
                kind=f.kind,
            )
            events.append(new(result, "deleted", *scope, f.provider_id))
        return events

    instances = [
        _Found(i.provider_id, i.owner_uid, i.created_at, "instance") for i in report.orphans
    ]
    out = orphan_events(instances, report.deleted, report.failed)
    left = report.leftovers
    if left is not None:
        found = [
            _Found(lo.provider_id, lo.owner_uid, lo.created_at, lo.kind) for lo in left.orphans
        ]
        # A scope of their own in the ids: a leftover's never collides with an instance's.
        out += orphan_events(found, left.deleted, left.failed, "leftover")
    summary = SweepCompleted(
        provider=report.provider,
        listed=report.listed,
        orphans=len(report.orphans),
        deleted=len(report.deleted),
        skipped=report.skipped,
        reason=report.reason,
        sweep_id=sweep_id,
        failed=len(report.failed),
        young=report.young,
        leftovers=len(left.orphans) if left else 0,
        leftovers_deleted=len(left.deleted) if left else 0,
        leftovers_failed=len(left.failed) if left else 0,
        leftovers_in_use=len(left.in_use) if left else 0,
        leftovers_reason=left.reason if left else "",
    )
    out.append(new(summary, "completed"))
    return out
