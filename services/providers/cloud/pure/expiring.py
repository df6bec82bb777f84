"""The catalogue caches of the cloud providers: what a cloud offers changes rarely, so each
provider instance believes an answer for an hour and keeps a bounded number of them
(docs/decisions/0141-hetzner-places-from-its-catalogue.md,
docs/decisions/0143-aws-checks-its-catalogue-before-a-launch.md). One shape for every cloud,
pure: the caller passes its clock in, so a test moves time without sleeping.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

TTL_SECONDS = 3600.0
"""How long an answer is believed: a cloud's catalogue changes over days, not minutes."""
SIZE = 256
"""More keys than any entry asks about (types x zones); the oldest goes first beyond it."""

K = TypeVar("K")
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """At most ``size`` values, each believed for ``ttl`` seconds from when it was put; ``now``
    is any monotonic clock, passed in. An entry put "later" than ``now`` (a clock that went
    back) is not believed either."""

    def __init__(self, ttl: float = TTL_SECONDS, size: int = SIZE) -> None:
        self.ttl = ttl
        self.size = size
        self._values: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        found = self._values.get(key)
        if found is None:
            return None
        at, value = found
        if not at <= now < at + self.ttl:
            del self._values[key]
            return None
        return value

    def put(self, key: K, value: V, now: float) -> None:
        self._values.pop(key, None)
        self._values[key] = (now, value)
        while len(self._values) > self.size:
            self._values.popitem(last=False)

    def forget(self, key: K) -> None:
        self._values.pop(key, None)

    def __len__(self) -> int:
        return len(self._values)
