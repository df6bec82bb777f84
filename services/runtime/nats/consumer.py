"""The durable pull-consumer loop every service runs.

Replicas of a service share one durable consumer, so JetStream spreads messages across them. Inside
one replica, messages of the same aggregate are handled one after another (in stream order) and
different aggregates concurrently, up to a bound.

A message is acknowledged only after its handler returned, and a handler returns only after its
appends were acknowledged by JetStream: a ``kill -9`` at any point leaves the message unacked, and
it is redelivered. Handlers are written to be idempotent (fold, decide, append with a
deterministic msg id), so a redelivery changes nothing that already happened.

The loop itself is ``while True: await step()``; ``step`` is finite and tested on its own.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
import structlog
from nats.aio.msg import Msg
from opentelemetry import trace

from events import codec, subjects
from events.errors import EventStoreError
from events.schemas import DeadLettered
from events.store import EventStore, NewEvent, derive_msg_id
from services.runtime.aio import raise_if_cancelled
from services.runtime.nats.connection import Connection
from services.runtime.nats.delivery import (
    ConsumerSpec,
    Delivery,
    GiveUp,
    Handler,
    Outcome,
    Retry,
    Settle,
    recorded_of,
)
from services.runtime.nats.durable import DurableGuard
from services.runtime.observability import spans
from services.runtime.observability.metrics import Metrics, default_metrics

log = structlog.get_logger("egress.consumer")

SHORT_FETCH = 1.0
SHORT_FETCHES_AFTER_BIND = 3
"""Fetches after a (re)bind wait at most SHORT_FETCH seconds, whatever the spec's timeout."""
_tracer = trace.get_tracer("egress_proxies.consumer")
__all__ = [
    "SHORT_FETCH",
    "SHORT_FETCHES_AFTER_BIND",
    "ConsumerLoop",
    "ConsumerSpec",
    "Delivery",
    "GiveUp",
    "Handler",
    "Outcome",
    "Retry",
    "Settle",
]


class ConsumerLoop:
    def __init__(
        self,
        conn: Connection,
        spec: ConsumerSpec,
        handler: Handler,
        *,
        store: EventStore,
        metrics: Metrics | None = None,
        settle: Settle | None = None,
    ) -> None:
        self.conn = conn
        self.spec = spec
        self.handler = handler
        self.settle = settle
        self.store = store
        self.metrics = metrics or default_metrics()
        self.guard = DurableGuard(
            conn.js,
            spec.stream,
            spec.config,
            self.metrics,
            spec.check_interval,
            earlier=frozenset(frozenset(f) for f in spec.earlier_filters),
        )
        self._sub: object | None = None
        self._bound_generation = -1
        self._short_fetches = 0
        self._slots = asyncio.Semaphore(spec.concurrency)
        self._inflight: dict[asyncio.Task[None], Msg] = {}
        self._keys: dict[str, asyncio.Lock] = {}
        self._key_users: dict[str, int] = {}
        durable = spec.durable
        self._acked = self.metrics.messages.labels(durable, "ack")
        self._timer = self.metrics.handle_seconds.labels(durable)

    # ------------------------------------------------------------------------------ lifecycle

    async def ensure(self) -> None:
        """Create the durable consumer, or check it is as declared and restore it when not
        (idempotent; replicas race harmlessly)."""
        await self.guard.check()

    async def run(self) -> None:
        await self.ensure()
        heartbeat = asyncio.create_task(self._heartbeat(), name=f"{self.spec.durable}-heartbeat")
        try:
            while True:
                raise_if_cancelled()
                await self.step()
        finally:
            heartbeat.cancel()
            await self.drain()
            await self.close()

    async def close(self) -> None:
        """Stop fetching: unsubscribe so the connection can drain without waiting on us."""
        old, self._sub = self._sub, None
        if old is not None:
            with contextlib.suppress(nats.errors.Error, ValueError):
                await old.unsubscribe()  # type: ignore[attr-defined]

    async def drain(self) -> None:
        """Wait for the handlers in flight (used on shutdown and by tests)."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    # ------------------------------------------------------------------------------- one step

    async def step(self) -> int:
        """Fetch what the free slots allow and start handling it; returns how many were fetched."""
        await self._slots.acquire()
        free = 1
        while free < self.spec.batch and not self._slots.locked():
            await self._slots.acquire()
            free += 1
        try:
            msgs = await self._fetch(free)
        except BaseException:
            for _ in range(free):
                self._slots.release()
            raise
        for _ in range(free - len(msgs)):
            self._slots.release()
        for msg in msgs:
            key = self.spec.key(msg.subject)
            if await self._settled(msg, key):
                self._slots.release()
                continue
            # The key is taken now, not when the task first runs: a later message of the same
            # aggregate must queue behind this one, never be settled before it.
            lock = self._keys.setdefault(key, asyncio.Lock())
            self._key_users[key] = self._key_users.get(key, 0) + 1
            task = asyncio.create_task(self._handle(msg, key, lock))
            self._inflight[task] = msg
            task.add_done_callback(self._done)
        self.metrics.consumer_inflight.labels(self.spec.durable).set(len(self._inflight))
        return len(msgs)

    async def _settled(self, msg: Msg, key: str) -> bool:
        """Settle ``msg`` inline when the service can without I/O (``settle``): no task, no
        span, acknowledged at once, the acknowledgements of one fetch written together by the
        client (docs/decisions/0165-deliveries-settled-inline.md). Only when nothing of
        its aggregate is being handled or waits, so the aggregate's order holds; what cannot be
        decoded, or what ``settle`` declines, takes the usual way."""
        if self.settle is None or key in self._keys:
            return False
        try:
            headers = dict(msg.headers or {})
            recorded = recorded_of(msg, headers, codec.decode(msg.data, headers))
            settled = self.settle(Delivery(recorded, msg.metadata.num_delivered, msg))
        except Exception:  # the usual way dead-letters it, retries it, or counts the failure
            return False
        if settled:
            self._acked.inc()
            await self._ack(msg)
        return settled

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "handler task crashed", consumer=self.spec.durable, error=str(task.exception())
            )

    async def _fetch(self, n: int) -> list[Msg]:
        if self._sub is not None and self.guard.due():
            try:
                if await self.guard.check():
                    await self.close()
            except EventStoreError as exc:
                log.warning("cannot check consumer", consumer=self.spec.durable, error=str(exc))
        if self._sub is None or self._bound_generation != self.conn.reconnects:
            try:
                await self._bind()
            except _NotBound:
                return []
        assert self._sub is not None
        reconnected = self.conn.reconnected
        timeout = self.spec.fetch_timeout
        if self._short_fetches > 0:
            # Right after a (re)bind: a server still recovering its streams can drop a pull
            # request without an answer, and a long fetch would wait all of it out.
            self._short_fetches -= 1
            timeout = min(timeout, SHORT_FETCH)
        fetch = asyncio.ensure_future(self._sub.fetch(n, timeout=timeout))  # type: ignore[attr-defined]
        # An abandoned fetch may still fail later (connection closed); retrieve its outcome so
        # asyncio does not report it as never retrieved.
        fetch.add_done_callback(lambda f: f.cancelled() or f.exception())
        woke = asyncio.ensure_future(reconnected.wait())
        try:
            await asyncio.wait({fetch, woke}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Stopping: the fetch must not outlive us and fail on the closed connection.
            fetch.cancel()
            raise
        finally:
            woke.cancel()
        if not fetch.done():
            # A pull request pending on the old server is gone for good: without this the
            # fetch would wait out its whole timeout (nats-py issue 504).
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)
            log.info("rebinding after reconnect", consumer=self.spec.durable)
            return []
        try:
            msgs: list[Msg] = fetch.result()
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except nats.errors.Error as exc:
            # "No responders" when the durable is gone: the rebind checks it (``durable``).
            log.warning("fetch failed, rebinding", consumer=self.spec.durable, error=str(exc))
            self._sub = None
            await asyncio.sleep(min(self.spec.fetch_timeout, 1.0))
            return []
        if msgs:
            self.metrics.consumer_lag.labels(self.spec.durable).set(msgs[-1].metadata.num_pending)
        return msgs

    async def _bind(self) -> None:
        """(Re)bind the pull subscription. After a server restart nats-py's old subscription
        stops receiving (nats-py issue 504), so every reconnection rebinds a fresh one."""
        await self.close()
        generation = self.conn.reconnects
        try:
            await self.ensure()
            self._sub = await self.conn.js.pull_subscribe_bind(
                durable=self.spec.durable, stream=self.spec.stream
            )
        except (EventStoreError, nats.errors.Error, TimeoutError) as exc:
            log.warning("cannot bind consumer yet", consumer=self.spec.durable, error=str(exc))
            await asyncio.sleep(0.5)
            raise _NotBound from exc
        self._bound_generation = generation
        self._short_fetches = SHORT_FETCHES_AFTER_BIND

    # ----------------------------------------------------------------------------- handling

    async def _handle(self, msg: Msg, key: str, lock: asyncio.Lock) -> None:
        try:
            async with lock:
                await self._handle_one(msg, msg.metadata.num_delivered)
        finally:
            self._key_users[key] -= 1
            if self._key_users[key] == 0:
                del self._key_users[key]
                del self._keys[key]

    async def _handle_one(self, msg: Msg, attempt: int) -> None:
        headers = dict(msg.headers or {})
        try:
            event = codec.decode(msg.data, headers)
        except codec.UnknownEventType as exc:
            await self._newer(msg, attempt, exc)
            return
        except codec.UndecodableEvent as exc:
            await self._dead_letter(msg, attempt, f"undecodable: {exc}")
            return
        recorded = recorded_of(msg, headers, event)
        with spans.current(
            _tracer,
            f"process {self.spec.durable}",
            context=spans.parent_of(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes=lambda: {
                "messaging.system": "nats",
                "messaging.operation.type": "process",
                "messaging.destination.name": msg.subject,
                "messaging.consumer.group.name": self.spec.durable,
                "messaging.message.id": recorded.msg_id,
                "egress.event_type": codec.event_type(event),
                "egress.attempt": attempt,
            },
        ) as span:
            try:
                with self._timer.time():
                    outcome = await self.handler(Delivery(recorded, attempt, msg))
            except GiveUp as exc:
                span.record_exception(exc)
                await self._dead_letter(msg, attempt, f"gave up: {exc}")
                return
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                await self._failed(msg, attempt, exc)
                return
            if isinstance(outcome, Retry):
                self.metrics.messages.labels(self.spec.durable, "retry").inc()
                await self._nak(msg, outcome.delay)
                return
            self._acked.inc()
            await self._ack(msg)

    async def _newer(self, msg: Msg, attempt: int, exc: codec.UnknownEventType) -> None:
        """An event of a type or schema this build cannot read: a newer version wrote it. The
        replicas of a service share their durable, so acknowledging it here could leave it
        handled by none of them during a rolling upgrade; it goes back for a replica that
        reads it, and after ``max_deliver`` rounds to the dead letters, whole, to be replayed
        once every replica reads it (docs/operations.md, "Upgrades")."""
        self.metrics.messages.labels(self.spec.durable, "skipped").inc()
        if attempt >= self.spec.max_deliver:
            await self._dead_letter(msg, attempt, f"written by a newer version: {exc}")
            return
        delay = min(self.spec.retry_max, self.spec.retry_base * 2 ** (attempt - 1))
        log.warning(
            "event of a newer version, left for a replica that reads it",
            consumer=self.spec.durable,
            event_type=exc.event_type,
            subject=msg.subject,
            attempt=attempt,
            error=str(exc),
        )
        await self._nak(msg, delay)

    async def _failed(self, msg: Msg, attempt: int, exc: Exception) -> None:
        if attempt >= self.spec.max_deliver:
            await self._dead_letter(
                msg, attempt, f"handler failed {attempt} times, last: {type(exc).__name__}: {exc}"
            )
            return
        delay = min(self.spec.retry_max, self.spec.retry_base * 2 ** (attempt - 1))
        log.warning(
            "handler failed, will retry",
            consumer=self.spec.durable,
            subject=msg.subject,
            attempt=attempt,
            delay=delay,
            error=f"{type(exc).__name__}: {exc}",
        )
        self.metrics.messages.labels(self.spec.durable, "failed").inc()
        await self._nak(msg, delay)

    async def _dead_letter(self, msg: Msg, attempt: int, reason: str) -> None:
        meta = msg.metadata
        record = DeadLettered(
            consumer=self.spec.durable,
            stream=meta.stream,
            subject=msg.subject,
            sequence=meta.sequence.stream,
            deliveries=attempt,
            reason=reason,
            payload=msg.data.decode("utf-8", errors="replace"),
            headers={k: v for k, v in (msg.headers or {}).items() if isinstance(v, str)},
        )
        msg_id = derive_msg_id(
            "deadletter", self.spec.durable, meta.stream, str(meta.sequence.stream)
        )
        try:
            await self.store.append(
                subjects.deadletter(self.spec.durable), [NewEvent(record, msg_id)]
            )
        except Exception as exc:
            log.error("cannot dead-letter, will retry", subject=msg.subject, error=str(exc))
            await self._nak(msg, self.spec.retry_max)
            return
        log.error("dead-lettered", consumer=self.spec.durable, subject=msg.subject, reason=reason)
        self.metrics.messages.labels(self.spec.durable, "deadletter").inc()
        await self._ack(msg)

    async def _ack(self, msg: Msg) -> None:
        # A lost ack only causes a redelivery, which idempotent handlers absorb.
        with contextlib.suppress(nats.errors.Error):
            await msg.ack()

    async def _nak(self, msg: Msg, delay: float) -> None:
        with contextlib.suppress(nats.errors.Error):
            await msg.nak(delay=delay)

    async def _heartbeat(self) -> None:
        """Keep every message this replica holds (running or queued behind its key) from being
        redelivered elsewhere while it waits."""
        interval = max(self.spec.ack_wait / 3, 0.1)
        while True:
            await asyncio.sleep(interval)
            for msg in list(self._inflight.values()):
                with contextlib.suppress(nats.errors.Error):
                    await msg.in_progress()


class _NotBound(Exception):
    """Binding failed; the step returns empty-handed and the loop tries again."""
