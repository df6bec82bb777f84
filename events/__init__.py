"""The event log: schemas, subjects, streams and the event-store API.

See docs/architecture.md, The event log.
"""

from events.errors import ConcurrencyError, EventStoreError, StoreUnavailable, StreamConfigMismatch
from events.store import (
    AppendResult,
    EventStore,
    History,
    NewEvent,
    Recorded,
    decide_and_append,
    derive_msg_id,
)

__all__ = [
    "AppendResult",
    "ConcurrencyError",
    "EventStore",
    "EventStoreError",
    "History",
    "NewEvent",
    "Recorded",
    "StoreUnavailable",
    "StreamConfigMismatch",
    "decide_and_append",
    "derive_msg_id",
]
