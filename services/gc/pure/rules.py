"""The rules that decide whether GC may delete something, shared by instances and leftovers.

Pure: an owner uid and a creation time in, a verdict out. Instances and a provider's leftovers
are judged by the same rules, so what protects a live proxy's VM protects its disk too.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Verdict(StrEnum):
    LIVE = "live"
    """Its owner proxy exists and has not been removed (deleting included)."""
    YOUNG = "young"
    """No live owner, but created within the grace: possibly a create in flight."""
    UNTAGGED = "untagged"
    """No owner uid: not tagged as ours."""
    ORPHAN = "orphan"


def moment(created: datetime | None) -> datetime:
    """A creation time as an aware datetime; a missing or zero time is the epoch (so it counts
    as old: something whose age cannot be told would otherwise be spared forever)."""
    if created is None:
        return EPOCH
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return max(created, EPOCH)


def judge(
    owner_uid: str,
    created_at: datetime | None,
    live_uids: AbstractSet[str],
    now: datetime,
    grace: float,
) -> Verdict:
    if not owner_uid:
        return Verdict.UNTAGGED
    if owner_uid in live_uids:
        return Verdict.LIVE
    if (now - moment(created_at)).total_seconds() < grace:
        return Verdict.YOUNG
    return Verdict.ORPHAN


@dataclass(frozen=True, slots=True)
class DeleteFailure:
    provider_id: str
    owner_uid: str
    error_class: str
    error: str
