"""Reading a stream in order, exactly once, without server-side state that outlives the reader.

An ephemeral, unacknowledged pull consumer in memory. Consumer sequences must be contiguous: on a
gap, a lost consumer or a reconnection the reader starts a new consumer right after the last
stream sequence it returned (the "ordered consumer" pattern). Projections and the CLI's log
reader both read this way.
"""

from __future__ import annotations

import contextlib
from datetime import datetime

import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from events.errors import EventStoreError, StoreUnavailable

log = structlog.get_logger("egress.ordered")


class OrderedPull:
    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        filter_subject: str,
        *,
        batch: int = 1000,
        inactive_threshold: float = 300.0,
        start_time: datetime | None = None,
    ) -> None:
        self.js = js
        self.start_time = start_time
        """Where the first read starts, by the server's clock, instead of the stream's first
        message: a reader of a time range skips what came before it on the server."""
        self.stream = stream
        self.filter_subject = filter_subject
        self.batch = batch
        self.inactive_threshold = inactive_threshold
        self.last_seq = 0
        self.num_pending = 0
        """What the server still had after the last message returned."""
        self._sub: JetStreamContext.PullSubscription | None = None
        self._consumer = ""
        self._consumer_seq = 0

    async def fetch(self, timeout: float) -> list[Msg]:
        """The next messages in order; empty when none came in time or the reader restarted."""
        sub = await self._subscription()
        try:
            msgs: list[Msg] = await sub.fetch(self.batch, timeout=timeout)
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except nats.errors.Error as exc:
            log.warning("ordered fetch failed, restarting", stream=self.stream, error=str(exc))
            await self.close()
            return []
        in_order: list[Msg] = []
        for msg in msgs:
            meta = msg.metadata
            if meta.sequence.consumer != self._consumer_seq + 1:
                log.info("ordered gap, restarting", stream=self.stream, after=self.last_seq)
                await self.close()
                break
            self._consumer_seq = meta.sequence.consumer
            self.last_seq = meta.sequence.stream
            self.num_pending = meta.num_pending
            in_order.append(msg)
        return in_order

    async def pending(self) -> int:
        """Messages the server has not delivered yet plus those queued here: only this count
        tells "nothing left" from "a slow fetch"."""
        server, queued = await self.pending_parts()
        return server + queued

    async def pending_parts(self) -> tuple[int, int]:
        """``(server, queued)``: what the server still holds for this reader, and what sits in
        the local queue. Queued entries may be status messages (a late "request timeout" of a
        fetch that already gave up), which no fetch ever returns."""
        for attempt in (1, 2):
            sub = await self._subscription()
            try:
                info = await sub.consumer_info()
            except (nats.errors.Error, TimeoutError) as exc:
                await self.close()
                if attempt == 2:
                    raise StoreUnavailable(f"reading {self.stream}: {exc}") from exc
                continue
            return int(info.num_pending or 0), sub.pending_msgs
        raise AssertionError("unreachable")

    async def restart(self) -> None:
        """Start over after the last message returned (e.g. after a reconnection)."""
        await self.close()

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with contextlib.suppress(nats.errors.Error, ValueError, TimeoutError):
            await sub.unsubscribe()
            await self.js.delete_consumer(self.stream, self._consumer)

    async def _subscription(self) -> JetStreamContext.PullSubscription:
        if self._sub is not None:
            return self._sub
        by_time = self.start_time is not None and self.last_seq == 0
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=(
                DeliverPolicy.BY_START_TIME if by_time else DeliverPolicy.BY_START_SEQUENCE
            ),
            opt_start_seq=None if by_time else self.last_seq + 1,
            opt_start_time=self.start_time if by_time else None,
            filter_subject=self.filter_subject,
            inactive_threshold=self.inactive_threshold,
            mem_storage=True,
            num_replicas=1,
        )
        self._consumer_seq = 0
        try:
            sub = await self.js.pull_subscribe(
                self.filter_subject, durable=None, stream=self.stream, config=config
            )
            self._consumer = (await sub.consumer_info()).name
        except NotFoundError as exc:
            raise EventStoreError(
                f"stream {self.stream} does not exist: create it with `egress-proxies streams init`"
            ) from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"cannot read {self.stream}: {exc}") from exc
        self._sub = sub
        return sub
