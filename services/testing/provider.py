"""The in-memory provider for tests: ``FakeProvider`` and its configurable variant, re-exported
from the product (``type: fake``, D150), and the variants no providers config can name.

The provider itself lives in ``services.providers.fake`` because it is a product provider (demos
and benchmarks run on it); what only a test needs lives here.
"""

from __future__ import annotations

from datetime import datetime

from services.providers.base import Leftover, ProviderError
from services.providers.fake import FakeConfig, FakeProvider, FakeProviderWithPreflight

__all__ = ["FakeConfig", "FakeProvider", "FakeProviderWithLeftovers", "FakeProviderWithPreflight"]

LEFTOVER_OPS = ("leftovers", "delete_leftover")


class FakeProviderWithLeftovers(FakeProvider):
    """A ``FakeProvider`` that is also a ``LeftoverCleaner``, with leftovers a test seeds, so
    GC's rules for them are tested without a hypervisor. A subclass, so the plain fake stays a
    provider without the capability."""

    def __init__(
        self,
        name: str = "fake",
        *,
        latency: float = 0.0,
        pending_polls: int = 0,
        ip_prefix: str = "10.0.0.",
    ) -> None:
        super().__init__(name, latency=latency, pending_polls=pending_polls, ip_prefix=ip_prefix)
        self.left: dict[str, Leftover] = {}
        self.in_use: set[str] = set()

    def leave(
        self, provider_id: str, owner_uid: str, created_at: datetime, kind: str = "volume"
    ) -> Leftover:
        """A leftover appears (a delete cut off after the instance went)."""
        leftover = Leftover(provider_id, owner_uid, created_at, kind)
        self.left[provider_id] = leftover
        return leftover

    def reuse(self, provider_id: str) -> None:
        """The leftover's instance comes back (a create resumed): it is in use again, so a
        delete must keep it and the next listing no longer reports it."""
        self.in_use.add(provider_id)

    def inject(self, op: str, error: ProviderError, times: int = 1) -> None:
        """As ``FakeProvider.inject``; also ``leftovers`` and ``delete_leftover``."""
        if op in LEFTOVER_OPS:
            self._injected[op].extend([error] * times)
        else:
            super().inject(op, error, times)

    async def leftovers(self) -> list[Leftover]:
        await self._enter("leftovers", self.name)
        return [lo for pid, lo in self.left.items() if pid not in self.in_use]

    async def delete_leftover(self, leftover: Leftover) -> bool:
        await self._enter("delete_leftover", leftover.provider_id)
        if leftover.provider_id in self.in_use:
            return False
        self.left.pop(leftover.provider_id, None)
        return True
