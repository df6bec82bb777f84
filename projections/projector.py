"""The projector runtime: feeds a stream into a keyed fold and keeps it current.

It reads through an ephemeral, unacknowledged pull consumer and checks that consumer sequences
are contiguous; on a gap, a reconnection or a lost consumer it starts a new consumer right after
the last stream sequence it applied (the "ordered consumer" pattern). Views are therefore built
exactly once per event, in stream order, and a rebuild from sequence 1 equals the live view.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events import codec
from events.store import Recorded
from events.subjects import proxy_uid_of

V = TypeVar("V")
Apply = Callable[[V | None, Recorded], V]

log = structlog.get_logger("egress.projector")


class Projector(Generic[V]):
    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        apply: Apply[V],
        *,
        key: Callable[[str], str] = proxy_uid_of,
        batch: int = 1000,
        idle_timeout: float = 1.0,
    ) -> None:
        self.js = js
        self.stream = stream
        self.filter_subject = filter_subject
        self.apply = apply
        self.key = key
        self.batch = batch
        self.idle_timeout = idle_timeout
        self.views: dict[str, V] = {}
        self.last_seq = 0
        self.applied = 0
        self.skipped = 0
        self._sub: JetStreamContext.PullSubscription | None = None
        self._consumer_seq = 0
        self._num_pending = 0
        self._advanced = asyncio.Condition()

    async def catch_up(self) -> int:
        """Apply everything in the stream now; returns how many events were applied.

        Ends only when the server reports nothing left: an empty short fetch alone can also mean
        a busy event loop, and a view built from half the stream would look complete.
        """
        before = self.applied
        remaining = await self._pending()
        while remaining > 0:
            got = await self.step(no_wait=True)
            remaining = self._num_pending if got else await self._pending()
        return self.applied - before

    async def _pending(self) -> int:
        if self._sub is None:
            await self._subscribe()
        assert self._sub is not None
        try:
            info = await self._sub.consumer_info()
        except nats.errors.Error:
            await self.close()
            await self._subscribe()
            assert self._sub is not None
            info = await self._sub.consumer_info()
        return int(info.num_pending or 0) + self._sub.pending_msgs

    async def run(self) -> None:
        await self.catch_up()
        while True:
            await self.step()

    async def wait_for(self, seq: int, timeout: float = 10.0) -> None:
        """Read-your-writes: wait until the view includes stream sequence ``seq``."""
        async with asyncio.timeout(timeout), self._advanced:
            await self._advanced.wait_for(lambda: self.last_seq >= seq)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error, ValueError):
                await sub.unsubscribe()

    async def step(self, *, no_wait: bool = False) -> int:
        """Fetch one batch and apply it; returns how many messages arrived."""
        if self._sub is None:
            await self._subscribe()
        assert self._sub is not None
        try:
            msgs = await self._sub.fetch(self.batch, timeout=0.05 if no_wait else self.idle_timeout)
        except (nats.errors.TimeoutError, TimeoutError):
            return 0
        except nats.errors.Error as exc:
            log.warning("projector fetch failed, resubscribing", error=str(exc))
            await self.close()
            return 0
        for msg in msgs:
            if not self._in_order(msg):
                await self.close()
                break
            self._apply(msg)
        async with self._advanced:
            self._advanced.notify_all()
        return len(msgs)

    def _in_order(self, msg: Msg) -> bool:
        meta = msg.metadata
        if meta.sequence.consumer != self._consumer_seq + 1:
            log.info("projector gap, restarting", after=self.last_seq)
            return False
        self._consumer_seq = meta.sequence.consumer
        return True

    def _apply(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        self.last_seq = seq
        self._num_pending = msg.metadata.num_pending
        try:
            event = codec.decode(msg.data, msg.headers)
        except codec.CodecError as exc:
            # Views skip what they cannot read; the consumers that act on events dead-letter it.
            self.skipped += 1
            log.warning("projector skipped an event", subject=msg.subject, seq=seq, error=str(exc))
            return
        headers = msg.headers or {}
        recorded = Recorded(
            event=event,
            seq=seq,
            subject=msg.subject,
            timestamp=msg.metadata.timestamp,
            msg_id=headers.get(codec.HDR_MSG_ID, ""),
            causation_id=headers.get(codec.HDR_CAUSATION, ""),
        )
        key = self.key(msg.subject)
        self.views[key] = self.apply(self.views.get(key), recorded)
        self.applied += 1

    async def _subscribe(self) -> None:
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last_seq + 1,
            filter_subject=self.filter_subject,
            inactive_threshold=300.0,
            mem_storage=True,
            num_replicas=1,
        )
        self._consumer_seq = 0
        self._sub = await self.js.pull_subscribe(
            self.filter_subject, durable=None, stream=self.stream, config=config
        )
