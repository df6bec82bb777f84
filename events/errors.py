"""Our error hierarchy for the event log; client-library errors are chained, never leaked."""

from __future__ import annotations


class EventStoreError(Exception):
    """Base of every event-log failure."""


class ConcurrencyError(EventStoreError):
    """The aggregate moved since it was folded: re-fold and decide again (never give up)."""

    def __init__(self, aggregate: str, expected: int, detail: str = "") -> None:
        super().__init__(
            f"{aggregate}: expected last sequence {expected}, the log has moved on"
            + (f" ({detail})" if detail else "")
        )
        self.aggregate = aggregate
        self.expected = expected


class StoreUnavailable(EventStoreError):
    """The log could not be reached or did not answer in time; safe to retry the same append."""


class NotSent(StoreUnavailable):
    """The append never left this process (no connection to the log): nothing was stored, so
    there is nothing to doubt, unlike a write whose answer was lost."""


class StreamConfigMismatch(EventStoreError):
    """A stream exists with settings other than ours; we report it rather than change it."""

    def __init__(self, stream: str, differences: dict[str, tuple[object, object]]) -> None:
        lines = ", ".join(
            f"{k}: have {have!r}, want {want!r}" for k, (have, want) in differences.items()
        )
        super().__init__(
            f"stream {stream} exists with a different configuration ({lines}); "
            f"fix it with `nats stream edit {stream}` or remove it deliberately, "
            "it is not changed automatically"
        )
        self.stream = stream
        self.differences = differences
