"""Reading a stream in order, in batches the reader asks for, each message handed over by a
subscription callback: for a reader that must get through a long stream at the least CPU per
event (the time-travel checkpoint writer's catch-up, docs/decisions/0163-checkpoints-as-deltas.md).

``OrderedPull.fetch`` goes through nats-py's ``fetch``, which awaits each message of a batch with
a timeout of its own (a task per message): about 45 us of a core per event, most of what a
catch-up costs. ``OrderedPush`` costs 17 us but is paced by nothing: a catch-up of a million
events would be pushed faster than it is folded, into the client's memory, until the client
drops it as a slow consumer. Here each request asks for ``batch`` messages of an ephemeral pull
consumer, the replies land in an inbox whose callback only appends them, and the next request
leaves once the reader has taken what the last one brought: the callback's cost per event, with
at most one batch held.

The guarantees are ``OrderedPull``'s: in order and exactly once. Consumer sequences must be
contiguous; on a gap, a request that ends in an error status or one that brings nothing in its
time (a lost consumer, a restarted server), the reader starts a new consumer right after the last
stream sequence it returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events.errors import EventStoreError, StoreUnavailable

log = structlog.get_logger("egress.batched")

STATUS_HEADER = "Status"
ENDED = frozenset({"404", "408"})
"""Statuses that end a request normally: no messages (now), or its time ran out."""


class BatchedPull:
    def __init__(
        self,
        nc: NATS,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        *,
        batch: int = 1000,
        inactive_threshold: float = 60.0,
    ) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.filter_subject = filter_subject
        self.batch = batch
        self.inactive_threshold = inactive_threshold
        self.last_seq = 0
        """The stream sequence of the last message returned; the next read starts after it."""
        self.restarts = 0
        self._sub: Subscription | None = None
        self._consumer = ""
        self._consumer_seq = 0
        self._got: list[Msg] = []
        self._asked = 0
        """Messages the outstanding request may still bring (0: no request outstanding)."""
        self._failed = ""
        self._wake = asyncio.Event()

    async def fetch(self, timeout: float) -> list[Msg]:
        """The next messages in order; empty when none came in time or the reader restarted."""
        if self._sub is None:
            await self._open()
        if not self._got and not self._asked:
            await self._ask(timeout)
        if not self._got and not self._failed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout + 1.0):
                    await self._wake.wait()
        self._wake.clear()
        got, self._got = self._got, []
        if self._failed or (not got and self._asked):
            # An error status, or a request that brought nothing and never ended: start over.
            log.info("batched read restarting", stream=self.stream, why=self._failed or "silent")
            await self.close()
            self.restarts += 1
            got = []
        in_order: list[Msg] = []
        for msg in got:
            meta = msg.metadata
            if meta.sequence.consumer != self._consumer_seq + 1:
                log.info("ordered gap, restarting", stream=self.stream, after=self.last_seq)
                await self.close()
                self.restarts += 1
                break
            self._consumer_seq = meta.sequence.consumer
            self.last_seq = meta.sequence.stream
            in_order.append(msg)
        return in_order

    def _deliver(self, msg: Msg) -> None:
        headers = msg.headers
        if headers and STATUS_HEADER in headers:
            status = headers[STATUS_HEADER]
            if status not in ENDED:
                self._failed = f"status {status} {headers.get('Description', '')}".strip()
            self._asked = 0
        elif msg.reply.startswith("$JS.ACK."):
            self._got.append(msg)
            self._asked = max(self._asked - 1, 0)
        else:
            return  # not a JetStream delivery: nothing this inbox was made for
        self._wake.set()

    async def _ask(self, timeout: float) -> None:
        assert self._sub is not None
        request = {"batch": self.batch, "expires": int(timeout * 1e9)}
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self._consumer}"
        try:
            await self.nc.publish(subject, msgspec.json.encode(request), reply=self._sub.subject)
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        self._asked = self.batch

    async def _open(self) -> None:
        sub_seen: list[Subscription] = []

        async def deliver(msg: Msg) -> None:
            if sub_seen and sub_seen[0] is self._sub:
                self._deliver(msg)

        self._got, self._asked, self._failed, self._consumer_seq = [], 0, "", 0
        try:
            sub = await self.nc.subscribe(self.nc.new_inbox(), cb=deliver)
        except nats.errors.Error as exc:
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        sub_seen.append(sub)
        config = ConsumerConfig(
            # Named, so the request's subject names it (as ``OrderedPush``'s).
            name=uuid.uuid4().hex,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.last_seq + 1,
            filter_subject=self.filter_subject,
            inactive_threshold=self.inactive_threshold,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            info = await self.js.add_consumer(self.stream, config=config)
        except NotFoundError as exc:
            await _unsubscribe(sub)
            raise EventStoreError(
                f"stream {self.stream} does not exist: create it with `egress-proxies streams init`"
            ) from exc
        except (nats.errors.Error, TimeoutError) as exc:
            await _unsubscribe(sub)
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        self._sub, self._consumer = sub, info.name

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        self._got, self._asked, self._failed = [], 0, ""
        if sub is None:
            return
        await _unsubscribe(sub)
        with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
            await self.js.delete_consumer(self.stream, self._consumer)


async def _unsubscribe(sub: Subscription) -> None:
    with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
        await sub.unsubscribe()
