"""Drawing a free proxy at random without copying the fleet (docs/architecture.md, "Scaling").

An acquire used to copy every leasable uid twice (the matching list, then the shuffle's own
copy) and filter the copies for the pool's namespace, spent budgets and the request's
exclusions. At 10^5 proxies that was a lease cycle's largest cost after the collector, 19.5 ms
against 1.7 ms at 10^3, for a request that takes the first or second proxy it draws. Here the
leasable proxies, and the holders of each attribute pair, sit in ``Drawable``s (a list with each
member's position, so a member leaves in O(1) by moving the last one into its place). An acquire
draws positions lazily (a sparse Fisher-Yates shuffle: only the positions drawn are remembered)
from the members, or from the holders of its selector's rarest pair, testing each uid drawn for
the other pairs; what a request excludes (another pool's namespace, a spent budget, its own
exclusions) is a test of each uid drawn too, not a pass over the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, overload


class Draws(Protocol):
    """What a draw needs of a generator (``random.Random`` has it): the caller owns the
    randomness, so this module stays pure and a test can seed it."""

    def random(self) -> float: ...


class Drawable(Sequence[str]):
    """A set of uids that can also be indexed: add, discard and membership in O(1), and a
    position to draw. The order is that of arrival, changed only by a removal (the last member
    takes the removed one's place), so a seeded draw over the same events is the same draw."""

    __slots__ = ("_at", "_items")

    def __init__(self) -> None:
        self._items: list[str] = []
        self._at: dict[str, int] = {}

    def add(self, uid: str) -> None:
        if uid not in self._at:
            self._at[uid] = len(self._items)
            self._items.append(uid)

    def discard(self, uid: str) -> None:
        at = self._at.pop(uid, None)
        if at is None:
            return
        last = self._items.pop()
        if at < len(self._items):
            self._items[at] = last
            self._at[last] = at

    def __contains__(self, uid: object) -> bool:
        return uid in self._at

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._items[index]


def random_order(items: Sequence[str], rng: Draws) -> Iterator[str]:
    """``items`` in random order, one draw per item taken and nothing copied: a Fisher-Yates
    shuffle that remembers only the positions it moved. ``items`` may change between two
    draws (a live ``Drawable`` while a claim awaits the log): a position past its end is
    skipped, a uid is never given twice, and the shuffle ends with the length it began with."""
    moved: dict[int, int] = {}
    given: set[str] = set()
    for end in range(len(items), 0, -1):
        pick = int(rng.random() * end)
        last = end - 1
        chosen = moved.get(pick, pick)
        moved[pick] = moved.pop(last, last)
        if chosen < len(items) and (uid := items[chosen]) not in given:
            given.add(uid)
            yield uid


@dataclass(frozen=True, slots=True)
class Candidates:
    """The proxies one request may get: ``uids`` to draw from (a live index or a list of its
    own), and ``keep``, what each drawn uid must also pass (its pool's namespace, its
    provider's budget, not excluded), asked only of the uids drawn."""

    uids: Sequence[str]
    keep: Callable[[str], bool] | None = None

    def __iter__(self) -> Iterator[str]:
        keep = self.keep
        return iter(self.uids) if keep is None else (uid for uid in self.uids if keep(uid))

    def __bool__(self) -> bool:
        """Whether any uid passes: the first that does ends the look."""
        return next(iter(self), None) is not None

    def also(self, keep: Callable[[str], bool] | None) -> Candidates:
        """These candidates, each also passing ``keep`` (None: no further test)."""
        if keep is None:
            return self
        first = self.keep
        if first is None:
            return Candidates(self.uids, keep)
        return Candidates(self.uids, lambda uid: first(uid) and keep(uid))

    def drawn(self, rng: Draws) -> Iterator[str]:
        """The candidates in random order, lazily (``random_order``)."""
        order = random_order(self.uids, rng)
        keep = self.keep
        return order if keep is None else (uid for uid in order if keep(uid))


NONE = Candidates(())
