from __future__ import annotations

import pytest

from services.runtime.connection import Connection
from services.runtime.eventlog.jetstream import JetStreamEventStore
from tests.contract.event_store import EventStoreContract, RawAppend

pytestmark = pytest.mark.integration


class TestJetStreamEventStore(EventStoreContract):
    @pytest.fixture
    def store(self, conn: Connection) -> JetStreamEventStore:
        return JetStreamEventStore(conn.nc, conn.js, read_batch=700)

    @pytest.fixture
    def raw_append(self, conn: Connection) -> RawAppend:
        async def append(stream: str, subject: str, data: bytes, headers: dict[str, str]) -> int:
            ack = await conn.js.publish(subject, data, headers=headers, stream=stream)
            return int(ack.seq)

        return append
