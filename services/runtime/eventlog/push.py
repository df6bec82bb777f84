"""Following a stream in order with an ephemeral push consumer: each event applied as it arrives.

``OrderedPull`` asks for events: one request per answer, and under load a choice between a
request per event (CPU) and a window that holds each event until it closes (latency). A view
that answers read-your-writes waits (discovery's) pays either on every request. Here the server
pushes each event to an inbox the moment it is stored, and the subscription's callback applies
it: no request, no task, no window (docs/architecture.md, "Projections").

The guarantees are ``OrderedPull``'s: in order and exactly once. The consumer is ephemeral,
unacknowledged and in memory, without flow control (its replies would cost a round trip per
window of events, and an unacknowledged consumer has nothing to pace). Consumer sequences must
be contiguous; on a gap, a heartbeat that names a consumer sequence we did not get, silence for
``STALL_HEARTBEATS`` heartbeats (a lost consumer, a restarted server) or a slow-consumer drop,
the follower starts a new consumer right after the last stream sequence it applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events.errors import EventStoreError, StoreUnavailable
from services.runtime.aio import raise_if_cancelled

log = structlog.get_logger("egress.push")

STALL_HEARTBEATS = 3
"""Heartbeats missed in a row after which the consumer counts as lost."""
STATUS_HEADER = "Status"
LAST_CONSUMER_HEADER = "Nats-Last-Consumer"


class OrderedPush:
    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        on_msg: Callable[[Msg], None],
        *,
        heartbeat: float = 2.0,
        inactive_threshold: float = 300.0,
    ) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.filter_subject = filter_subject
        self.on_msg = on_msg
        """Applies one message, in order; must not raise (a fold's errors are its own)."""
        self.heartbeat = heartbeat
        self.inactive_threshold = inactive_threshold
        self.last_seq = 0
        """The stream sequence of the last message handed to ``on_msg``."""
        self.restarts = 0
        self._consumer_seq = 0
        self._heard = 0.0
        self._broken: asyncio.Event = asyncio.Event()
        self._generation = 0
        self.inbox = ""
        """The current consumer's deliver subject."""

    async def run(self, after: int) -> None:
        """Apply every message after stream sequence ``after``, for ever (cancel to stop)."""
        self.last_seq = after
        while True:
            raise_if_cancelled()
            try:
                sub, consumer = await self._open()
            except EventStoreError as exc:
                log.warning("push follower cannot subscribe", stream=self.stream, error=str(exc))
                await asyncio.sleep(self.heartbeat)
                continue
            try:
                await self._until_broken()
            finally:
                await self._close(sub, consumer)
            self.restarts += 1
            log.info("push follower restarting", stream=self.stream, after=self.last_seq)

    async def _until_broken(self) -> None:
        """Return once the current consumer can no longer be trusted to deliver in order."""
        stall = self.heartbeat * STALL_HEARTBEATS
        while not self._broken.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat):
                    await self._broken.wait()
            if time.monotonic() - self._heard > stall:
                log.info("push follower heard nothing", stream=self.stream, seconds=stall)
                return

    async def _open(self) -> tuple[Subscription, str]:
        self._generation += 1
        generation = self._generation
        self._broken = asyncio.Event()
        self._consumer_seq = 0
        self._heard = time.monotonic()
        inbox = self.inbox = self.nc.new_inbox()

        async def deliver(msg: Msg) -> None:
            if generation == self._generation:
                self._deliver(msg)

        try:
            sub = await self.nc.subscribe(inbox, cb=deliver)
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"cannot follow {self.stream}: {exc}") from exc
        config = ConsumerConfig(
            # Named, so the request's subject names it: the services may not use the unnamed
            # form, whose body could name another service's durable
            # (docs/decisions/0093-each-service-s-durable.md).
            name=uuid.uuid4().hex,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last_seq + 1,
            filter_subject=self.filter_subject,
            deliver_subject=inbox,
            flow_control=False,
            idle_heartbeat=self.heartbeat,
            inactive_threshold=self.inactive_threshold,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            info = await self.js.add_consumer(self.stream, config=config)
        except NotFoundError as exc:
            await self._close(sub, "")
            raise EventStoreError(
                f"stream {self.stream} does not exist: create it with `egress-proxies streams init`"
            ) from exc
        except (nats.errors.Error, TimeoutError) as exc:
            await self._close(sub, "")
            raise StoreUnavailable(f"cannot follow {self.stream}: {exc}") from exc
        return sub, info.name

    def _deliver(self, msg: Msg) -> None:
        self._heard = time.monotonic()
        headers = msg.headers
        if headers and STATUS_HEADER in headers:
            # An idle heartbeat: it names the last consumer sequence the server sent.
            last = headers.get(LAST_CONSUMER_HEADER)
            if last is not None and last.isdigit() and int(last) != self._consumer_seq:
                log.info("push follower missed events", stream=self.stream, after=self.last_seq)
                self._broken.set()
            return
        try:
            meta = msg.metadata
        except (nats.errors.Error, ValueError, IndexError):
            return  # not a JetStream delivery: nothing this inbox was made for
        if meta.sequence.consumer != self._consumer_seq + 1:
            log.info("ordered gap, restarting", stream=self.stream, after=self.last_seq)
            self._generation += 1  # drop whatever this consumer still delivers
            self._broken.set()
            return
        self._consumer_seq = meta.sequence.consumer
        self.on_msg(msg)
        self.last_seq = meta.sequence.stream

    async def _close(self, sub: Subscription, consumer: str) -> None:
        self._generation += 1
        with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
            await sub.unsubscribe()
        if consumer:
            with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
                await self.js.delete_consumer(self.stream, consumer)
