"""One create per instance name at a time, in this process.

A cloud create is made idempotent by looking for an instance of the name before making one
(docs/providers.md, "Cloud VMs"); two creates of one name racing in the same process would both
look, find nothing and both make one. So each provider serialises the creates of a name here.
Names come and go with every replacement, so a name's lock lives only while someone holds it or
waits for it: memory stays bounded by the creates in flight, not by every name ever created.

A ``Mapping`` of the names in use to how many callers hold or await each: what a test (or a
debugger) looks at to see that released names are forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass


@dataclass(slots=True)
class _Entry:
    lock: asyncio.Lock
    users: int = 0


class NameLocks(Mapping[str, int]):
    """``async with locks.held(name):`` runs the block alone among callers of ``name``."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @contextlib.asynccontextmanager
    async def held(self, name: str) -> AsyncIterator[None]:
        entry = self._entries.get(name)
        if entry is None:
            entry = self._entries[name] = _Entry(asyncio.Lock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            # Counted, not asked of the lock: a waiter cancelled while the lock is free would
            # otherwise leave an entry nobody removes.
            entry.users -= 1
            if not entry.users:
                del self._entries[name]

    def __getitem__(self, name: str) -> int:
        return self._entries[name].users

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"NameLocks({dict(self)!r})"
