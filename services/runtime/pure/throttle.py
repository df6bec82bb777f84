"""Failed logins counted per address, a token bucket each: the console's login and the gateway's
proxy login refuse an address that keeps guessing (docs/operations.md, "Security model").

Pure: the caller passes the time.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class LoginThrottle:
    """At most ``per_minute`` failed logins per client address (a token bucket each); the
    addresses are bounded, the oldest forgotten first."""

    per_minute: float = 5.0
    max_addresses: int = 10_000
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)

    def retry_after(self, address: str, now: float) -> float:
        """Seconds until ``address`` may try again (0: now)."""
        tokens = self._tokens(address, now)
        return 0.0 if tokens >= 1 else (1 - tokens) * 60 / self.per_minute

    def failed(self, address: str, now: float) -> None:
        self._buckets[address] = (max(self._tokens(address, now) - 1, 0.0), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (self.per_minute, now))
        return min(self.per_minute, tokens + (now - at) * self.per_minute / 60)
