"""The events of garbage collection (``gc.<provider>``): orphaned instances and leftovers found
and deleted, and each sweep's summary.

Part of the one tagged union ``events.schemas`` defines (and re-exports these from); the rules
there (new fields take defaults) hold here. See docs/architecture.md, The event log.
"""

from __future__ import annotations

from typing import ClassVar

from events.base import Event


class OrphanFound(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "gc"
    provider: str
    provider_id: str
    owner_uid: str
    created_at: str = ""
    sweep_id: str = ""
    """The sweep that found it: the same id on its ``OrphanDeleted`` and ``SweepCompleted``."""
    kind: str = "instance"
    """``instance``, or what kind of leftover a provider reported (e.g. ``volume``): something
    it made for an instance that outlived it."""


class OrphanDeleted(Event, frozen=True, kw_only=True):
    """The result of deleting one orphan; ``ok=False`` records a failed attempt (the next sweep
    tries again), so the log shows every attempt, not only the successes."""

    category: ClassVar[str] = "gc"
    provider: str
    provider_id: str
    owner_uid: str
    sweep_id: str = ""
    ok: bool = True
    error_class: str = ""
    error: str = ""
    kind: str = "instance"
    """As on ``OrphanFound``."""


class SweepCompleted(Event, frozen=True, kw_only=True):
    category: ClassVar[str] = "gc"
    provider: str
    listed: int
    orphans: int
    deleted: int
    skipped: bool = False
    reason: str = ""
    sweep_id: str = ""
    failed: int = 0
    """Orphans whose delete failed this round (not counted in ``deleted``)."""
    young: int = 0
    """Instances of no live proxy spared because they are younger than the grace."""
    leftovers: int = 0
    """Orphaned leftovers found (not counted in ``orphans``); the fields below are theirs."""
    leftovers_deleted: int = 0
    leftovers_failed: int = 0
    leftovers_in_use: int = 0
    """Kept at delete time because their instance came back (a create resumed)."""
    leftovers_reason: str = ""
    """Why the leftovers were skipped this round (their listing failed); "" when they were not."""
