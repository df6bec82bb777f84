"""How long the executor's durable waits are: the delays a command's redeliveries keep."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """How long the durable waits are. Production keeps the defaults; tests shrink them."""

    poll_initial: float = 0.5
    poll_max: float = 5.0
    poll_growth: float = 1.5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    quota_delay: float = 60.0
    create_timeout: float = 600.0
    retry_for: float = 600.0
    """How long transient failures are retried before the command is answered Transient, so
    the reconciler hears of a provider that has been failing for a while instead of silence."""

    def poll_delay(self, attempt: int) -> float:
        """Polls start fast (most instances run within seconds) and slow down for slow ones."""
        return min(self.poll_max, self.poll_initial * self.poll_growth ** min(attempt - 1, 60))

    def backoff(self, attempt: int) -> float:
        """Exponential, so a struggling provider API is not hammered by every waiting command."""
        return min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 60))
