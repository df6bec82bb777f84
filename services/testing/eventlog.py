"""Public test helpers for code built on the event log.

The in-memory store honours the same contract as the JetStream store (the same suite runs against
both), so a service's decision logic can be tested without a server.
"""

from events.subjects import subject_matches
from services.runtime.eventlog.memory import InMemoryEventStore

__all__ = ["InMemoryEventStore", "subject_matches"]
