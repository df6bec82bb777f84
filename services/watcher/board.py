"""What the leader knows about the cluster between events, shared by the watch and the writer.

Nothing here is authoritative: a new leader rebuilds it all from its first listing, which is why
problems (a missing Secret) live here and not in the log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from services.watcher.pure.objects import Problem, ProxyObject


@dataclass
class Board:
    objects: dict[str, ProxyObject] = field(default_factory=dict)
    problems: dict[str, Problem] = field(default_factory=dict)
    mirrors: dict[str, ProxyObject] = field(default_factory=dict)
    """Member uid in the log -> the Proxy object mirroring it (``mirrors``): its uid in the
    cluster is not the member's, so the status writer finds it here."""
    dirty: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def mark(self, uid: str) -> None:
        self.dirty.add(uid)
        self.changed.set()

    def put(self, obj: ProxyObject) -> None:
        self.objects[obj.uid] = obj
        self.mark(obj.uid)

    def forget(self, uid: str) -> None:
        self.objects.pop(uid, None)
        self.problems.pop(uid, None)

    def set_problem(self, uid: str, problem: Problem | None) -> None:
        if self.problems.get(uid) == problem:
            return
        if problem is None:
            self.problems.pop(uid, None)
        else:
            self.problems[uid] = problem
        self.mark(uid)

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        self.changed.clear()
        return dirty
