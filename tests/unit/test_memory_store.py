from __future__ import annotations

import pytest

from services.runtime.eventlog.memory import InMemoryEventStore
from tests.contract.event_store import EventStoreContract, RawAppend


class TestInMemoryEventStore(EventStoreContract):
    @pytest.fixture
    def store(self) -> InMemoryEventStore:
        return InMemoryEventStore()

    @pytest.fixture
    def raw_append(self, store: InMemoryEventStore) -> RawAppend:
        async def append(stream: str, subject: str, data: bytes, headers: dict[str, str]) -> int:
            return store.raw_append(stream, subject, data, headers)

        return append
