"""One orphan sweep: list every provider, decide what is orphaned, delete it.

The decision (``verdict`` / ``orphans``) is pure, so the rules that protect live proxies are tested
as a table without servers. ``sweep_once`` is the finite I/O step around it; the service repeats
it on a timer under a lock, and ``gc run-once`` calls it once.

Safety rules, all of which err towards keeping an instance:

- a provider whose listing fails is skipped for the round: a partial list must never be read as
  "everything else is gone";
- the live uids are read *after* the listings: any instance listed was created by a command whose
  proxy was declared before it, so the owner is already in the view we compare against;
- a proxy stays live until its ``ProxyRemoved`` event, so an instance the reconciler is still
  deleting is the reconciler's business, never GC's;
- an instance younger than the grace is spared (a create in flight whose proxy the view has not
  caught up with yet, or one made by another system writing to the same tags);
- an instance without an owner uid is not ours to judge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import structlog

from services.executor.providers.base import Instance, NotFound, Provider, ProviderError

log = structlog.get_logger("egress.gc")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LiveSource = Callable[[], Awaitable[AbstractSet[str]]]


class Verdict(StrEnum):
    LIVE = "live"
    """Its owner proxy exists and has not been removed (deleting included)."""
    YOUNG = "young"
    """No live owner, but created within the grace: possibly a create in flight."""
    UNTAGGED = "untagged"
    """No owner uid: not tagged as ours."""
    ORPHAN = "orphan"


def created_at_of(instance: Instance) -> datetime:
    """When the instance was made; a missing or zero time is the epoch (so it counts as old:
    an instance whose age cannot be told would otherwise be spared forever)."""
    created: datetime | None = instance.created_at
    if created is None:
        return EPOCH
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return max(created, EPOCH)


def verdict(
    instance: Instance, live_uids: AbstractSet[str], now: datetime, grace: float
) -> Verdict:
    if not instance.owner_uid:
        return Verdict.UNTAGGED
    if instance.owner_uid in live_uids:
        return Verdict.LIVE
    if (now - created_at_of(instance)).total_seconds() < grace:
        return Verdict.YOUNG
    return Verdict.ORPHAN


def orphans(
    instances: Iterable[Instance], live_uids: AbstractSet[str], now: datetime, grace: float
) -> list[Instance]:
    """The instances GC should delete, in the order listed."""
    return [i for i in instances if verdict(i, live_uids, now, grace) is Verdict.ORPHAN]


@dataclass(frozen=True, slots=True)
class DeleteFailure:
    provider_id: str
    owner_uid: str
    error_class: str
    error: str


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


async def _list(name: str, provider: Provider) -> tuple[list[Instance], str]:
    """The listing, or the reason it failed ("" when it did not)."""
    try:
        return await provider.list_by_tag(), ""
    except ProviderError as exc:
        reason = f"{exc.error_class}: {exc}"
    except Exception as exc:
        # Outside the taxonomy (a provider bug): still a listing we cannot trust.
        reason = f"unclassified {type(exc).__name__}: {exc}"
    log.warning("gc skips a provider this round: its listing failed", provider=name, reason=reason)
    return [], reason


async def _delete(
    provider: Provider, report: ProviderReport, instance: Instance, slots: asyncio.Semaphore
) -> None:
    pid = instance.provider_id
    async with slots:
        try:
            await provider.delete(pid)
        except NotFound:
            pass  # gone already: the goal is reached
        except ProviderError as exc:
            failure = DeleteFailure(pid, instance.owner_uid, str(exc.error_class), str(exc))
            report.failed.append(failure)
            log.warning(
                "orphan delete failed", provider=report.provider, provider_id=pid, **_e(exc)
            )
            return
        except Exception as exc:
            failure = DeleteFailure(pid, instance.owner_uid, "Unclassified", repr(exc))
            report.failed.append(failure)
            log.warning(
                "orphan delete failed", provider=report.provider, provider_id=pid, **_e(exc)
            )
            return
    report.deleted.append(pid)
    log.info("orphan deleted", provider=report.provider, provider_id=pid, owner=instance.owner_uid)


def _e(exc: BaseException) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}"}


async def sweep_once(
    providers: Mapping[str, Provider],
    live_uids: AbstractSet[str] | LiveSource,
    now: datetime,
    grace: float,
    dry_run: bool = False,
    *,
    concurrency: int = 8,
) -> SweepReport:
    """List all providers, then read the live uids (a set, or a coroutine function for the
    read-after-listing order the module docstring explains), then delete the orphans unless
    ``dry_run``. Never raises for a provider's failure: it is in the report."""
    names = sorted(providers)
    listings = await asyncio.gather(*(_list(n, providers[n]) for n in names))
    live = live_uids if isinstance(live_uids, AbstractSet) else await live_uids()
    report = SweepReport(now=now, grace=grace, dry_run=dry_run)
    for name, (instances, reason) in zip(names, listings, strict=True):
        entry = ProviderReport(provider=name, listed=len(instances), skipped=bool(reason))
        entry.reason = reason
        if not reason:
            verdicts = [(i, verdict(i, live, now, grace)) for i in instances]
            entry.orphans = [i for i, v in verdicts if v is Verdict.ORPHAN]
            entry.young = sum(v is Verdict.YOUNG for _, v in verdicts)
        report.providers.append(entry)
    if not dry_run:
        slots = asyncio.Semaphore(concurrency)
        await asyncio.gather(
            *(
                _delete(providers[entry.provider], entry, instance, slots)
                for entry in report.providers
                for instance in entry.orphans
            )
        )
        for entry in report.providers:
            # Deletes finish in any order; the report lists them as the provider did.
            order = {i.provider_id: n for n, i in enumerate(entry.orphans)}
            entry.deleted.sort(key=order.__getitem__)
            entry.failed.sort(key=lambda f: order[f.provider_id])
    return report
