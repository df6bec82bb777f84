"""The leftover part of a sweep: what a provider made for an instance and left behind without it.

A provider that is a ``LeftoverCleaner`` (base.py says why the capability exists) reports such
resources; GC judges them by the instance rules (``rules.judge``) and deletes the orphans. Extra
safety rules, again erring towards keeping:

- leftovers are listed only for a provider whose instance listing succeeded, and before the live
  uids are read (the same read-after-listing order as instances);
- a failed leftover listing skips the leftovers of that provider for the round (logged, in the
  report), never its instances, and never acts on part of a listing;
- owner uids are compared case-insensitively: a leftover often carries its owner in a resource
  name, which may be lowercased (DNS labels), and a false match only keeps something;
- ``delete_leftover`` answering False (in use again: a create resumed) counts as kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Set as AbstractSet
from datetime import datetime

import structlog

from services.gc.pure.report import LeftoverReport
from services.gc.pure.rules import DeleteFailure, Verdict, judge
from services.providers.base import Leftover, LeftoverCleaner, NotFound, ProviderError

__all__ = [
    "LeftoverReport",
    "delete_leftover",
    "judge_leftovers",
    "list_leftovers",
    "sort_results",
]

log = structlog.get_logger("egress.gc")


async def list_leftovers(name: str, cleaner: LeftoverCleaner) -> LeftoverReport:
    """The provider's leftovers, or a skipped report saying why they could not be listed."""
    try:
        found = await cleaner.leftovers()
    except ProviderError as exc:
        reason = f"{exc.error_class}: {exc}"
    except Exception as exc:
        reason = f"unclassified {type(exc).__name__}: {exc}"
    else:
        return LeftoverReport(listed=len(found), found=found)
    log.warning(
        "gc skips a provider's leftovers this round: listing them failed",
        provider=name,
        reason=reason,
    )
    return LeftoverReport(skipped=True, reason=reason)


def judge_leftovers(
    report: LeftoverReport, live_uids: AbstractSet[str], now: datetime, grace: float
) -> None:
    """Pick the orphans out of the listing (case-insensitive owners: see the module docstring)."""
    folded = {uid.lower() for uid in live_uids}
    verdicts = [
        (lo, judge(lo.owner_uid.lower(), lo.created_at, folded, now, grace)) for lo in report.found
    ]
    report.orphans = [lo for lo, v in verdicts if v is Verdict.ORPHAN]
    report.young = sum(v is Verdict.YOUNG for _, v in verdicts)


async def delete_leftover(
    name: str,
    cleaner: LeftoverCleaner,
    report: LeftoverReport,
    leftover: Leftover,
    slots: asyncio.Semaphore,
) -> None:
    pid, owner = leftover.provider_id, leftover.owner_uid
    context = {"provider": name, "provider_id": pid, "kind": leftover.kind}
    async with slots:
        try:
            gone = await cleaner.delete_leftover(leftover)
        except NotFound:
            gone = True  # gone already: the goal is reached
        except ProviderError as exc:
            report.failed.append(DeleteFailure(pid, owner, str(exc.error_class), str(exc)))
            log.warning("leftover delete failed", **context, error=f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:
            report.failed.append(DeleteFailure(pid, owner, "Unclassified", repr(exc)))
            log.warning("leftover delete failed", **context, error=f"{type(exc).__name__}: {exc}")
            return
    if gone:
        report.deleted.append(pid)
        log.info("leftover deleted", **context, owner=owner)
    else:
        report.in_use.append(pid)
        log.info("leftover kept: in use again", **context, owner=owner)


def sort_results(report: LeftoverReport) -> None:
    """Deletes finish in any order; the report lists them as the provider did."""
    order = {lo.provider_id: n for n, lo in enumerate(report.orphans)}
    report.deleted.sort(key=order.__getitem__)
    report.in_use.sort(key=order.__getitem__)
    report.failed.sort(key=lambda f: order[f.provider_id])
