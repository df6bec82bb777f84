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

A provider that is also a ``LeftoverCleaner`` has its leftovers swept by the same rules in the
same round (leftovers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime

import structlog

from services.gc import leftovers
from services.gc.pure.report import LeftoverReport, ProviderReport, SweepReport
from services.gc.pure.rules import EPOCH, DeleteFailure, Verdict, judge
from services.providers.base import (
    Instance,
    LeftoverCleaner,
    NotFound,
    Provider,
    ProviderError,
)

__all__ = [
    "EPOCH",
    "DeleteFailure",
    "LiveSource",
    "ProviderReport",
    "SweepReport",
    "Verdict",
    "orphans",
    "sweep_once",
    "verdict",
]

log = structlog.get_logger("egress.gc")

LiveSource = Callable[[], Awaitable[AbstractSet[str]]]


def verdict(
    instance: Instance, live_uids: AbstractSet[str], now: datetime, grace: float
) -> Verdict:
    return judge(instance.owner_uid, instance.created_at, live_uids, now, grace)


def orphans(
    instances: Iterable[Instance], live_uids: AbstractSet[str], now: datetime, grace: float
) -> list[Instance]:
    """The instances GC should delete, in the order listed."""
    return [i for i in instances if verdict(i, live_uids, now, grace) is Verdict.ORPHAN]


Listing = tuple[list[Instance], str, LeftoverReport | None]


async def _list(name: str, provider: Provider) -> Listing:
    """The listing or the reason it failed ("" when it did not), then the leftovers of a
    provider that has them, only when its listing succeeded."""
    try:
        instances = await provider.list_by_tag()
    except ProviderError as exc:
        reason = f"{exc.error_class}: {exc}"
    except Exception as exc:
        # Outside the taxonomy (a provider bug): still a listing we cannot trust.
        reason = f"unclassified {type(exc).__name__}: {exc}"
    else:
        if isinstance(provider, LeftoverCleaner):
            return instances, "", await leftovers.list_leftovers(name, provider)
        return instances, "", None
    log.warning("gc skips a provider this round: its listing failed", provider=name, reason=reason)
    return [], reason, None


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
    for name, (instances, reason, left) in zip(names, listings, strict=True):
        entry = ProviderReport(provider=name, listed=len(instances), skipped=bool(reason))
        entry.reason = reason
        if not reason:
            verdicts = [(i, verdict(i, live, now, grace)) for i in instances]
            entry.orphans = [i for i, v in verdicts if v is Verdict.ORPHAN]
            entry.young = sum(v is Verdict.YOUNG for _, v in verdicts)
        if left is not None and not left.skipped:
            leftovers.judge_leftovers(left, live, now, grace)
        entry.leftovers = left
        report.providers.append(entry)
    if not dry_run:
        await _delete_all(providers, report, asyncio.Semaphore(concurrency))
    return report


async def _delete_all(
    providers: Mapping[str, Provider], report: SweepReport, slots: asyncio.Semaphore
) -> None:
    """Instances and leftovers together, at most ``slots`` at a time across all providers."""
    deletes: list[Awaitable[None]] = []
    for entry in report.providers:
        provider = providers[entry.provider]
        deletes += [_delete(provider, entry, instance, slots) for instance in entry.orphans]
        left = entry.leftovers
        if left is not None and isinstance(provider, LeftoverCleaner):
            deletes += [
                leftovers.delete_leftover(entry.provider, provider, left, leftover, slots)
                for leftover in left.orphans
            ]
    await asyncio.gather(*deletes)
    for entry in report.providers:
        # Deletes finish in any order; the report lists them as the provider did.
        order = {i.provider_id: n for n, i in enumerate(entry.orphans)}
        entry.deleted.sort(key=order.__getitem__)
        entry.failed.sort(key=lambda f: order[f.provider_id])
        if entry.leftovers is not None:
            leftovers.sort_results(entry.leftovers)
