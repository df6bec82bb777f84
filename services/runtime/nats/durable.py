"""Keeping a service's durable consumer as the service declares it
(docs/decisions/0093-each-service-s-durable.md).

A durable whose filter was retargeted delivers nothing the service waits for and reports nothing
pending, so no lag alert fires; one that vanished and is created again as declared starts over
from the first event. Only the service's own NATS user may touch its durable
(``services.runtime.nats.users``), but the admin may, so each replica checks: on every (re)bind
of the consumer loop (which follows any fetch error, "consumer not found" included) and every
``check_interval`` seconds. A durable found changed or gone is logged, counted in
``egress_consumer_drift_total`` (an alert watches it) and created again from where the service
is known to have acknowledged everything: the ack floor the replica last saw on the durable as
declared. From there, the messages appended meanwhile are delivered again; handlers are
idempotent, so those already handled change nothing.

Replicas share the durable and may restore it at once: each restore starts at or before an ack
floor that was true, so whichever wins loses nothing, and a restored durable (marked in its
metadata) is not taken for a change by the other replicas.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from events.errors import EventStoreError, StoreUnavailable
from services.runtime.observability.metrics import Metrics

log = structlog.get_logger("egress.durable")
T = TypeVar("T")
STREAM_NOT_FOUND = 10059
"""JetStream's error code for a missing stream (10014 is a missing consumer)."""

RESTORED = "egress-restored-at"
"""Metadata key of a durable this code created from a start sequence: its value is the start."""

KINDS = ("vanished", "filter", "deliver_policy", "start", "ack_policy")
"""What ``drifts`` reports, the ``kind`` label of ``egress_consumer_drift_total``."""

SETTINGS = ("ack_wait", "max_deliver", "max_ack_pending")
"""What a new version may change on a running durable in place, uncounted."""


def filters(config: ConsumerConfig) -> frozenset[str]:
    """A consumer's filter, however it was set (one subject or a list)."""
    found = set(config.filter_subjects or ())
    if config.filter_subject:
        found.add(config.filter_subject)
    return frozenset(found)


def drifts(declared: ConsumerConfig, found: ConsumerInfo | None, floor: int | None) -> list[str]:
    """How ``found`` differs from ``declared`` in ways that lose or withhold messages; empty
    when it is as declared. ``floor``: the ack floor last seen on the durable as declared."""
    if found is None:
        return ["vanished"]
    config, kinds = found.config, []
    if filters(config) != filters(declared):
        kinds.append("filter")
    policy = config.deliver_policy
    if policy not in (DeliverPolicy.ALL, DeliverPolicy.BY_START_SEQUENCE):
        kinds.append("deliver_policy")
    elif (
        policy == DeliverPolicy.BY_START_SEQUENCE
        and RESTORED not in (config.metadata or {})
        and floor is not None
        and (config.opt_start_seq or 0) > floor + 1
    ):
        # Created again behind our back from a later start: what lies between is skipped.
        kinds.append("start")
    if config.ack_policy != AckPolicy.EXPLICIT:
        kinds.append("ack_policy")
    return kinds


class DurableGuard:
    """One replica's checks of one durable; ``check`` is one bounded step (an info request and
    at most a delete and a create), the loop around it is the consumer loop's."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        config: Callable[[int | None], ConsumerConfig],
        metrics: Metrics,
        interval: float,
        *,
        earlier: frozenset[frozenset[str]] = frozenset(),
    ) -> None:
        self.js = js
        self.earlier = earlier
        """Filters of earlier versions, updated in place to the declared one."""
        self.stream = stream
        self.config = config
        """The declared configuration, delivering everything (None) or from a start sequence."""
        self.metrics = metrics
        self.interval = interval
        self.floor: int | None = None
        """Stream sequence of the ack floor last seen on the durable as declared: every message
        up to it was acknowledged, after its handler's appends were."""
        self._checked = -math.inf
        for kind in KINDS:
            # At zero from the start: ``increase()`` misses a series' first sample.
            metrics.consumer_drift.labels(self.durable, kind)

    @property
    def durable(self) -> str:
        return self.config(None).durable_name or ""

    def due(self) -> bool:
        return time.monotonic() - self._checked >= self.interval

    async def check(self) -> bool:
        """Make sure the durable exists as declared; True when it was created (bind afresh)."""
        self._checked = time.monotonic()
        found = await self._info()
        if found is None and self.floor is None:
            # Never seen by this replica: nothing known to lose (a first start).
            self._seen(await self._create(None))
            return True
        if found is not None and filters(found.config) in self.earlier:
            log.info(
                "durable consumer of an earlier version, updating its filter",
                consumer=self.durable,
                found=sorted(filters(found.config)),
                declared=sorted(filters(self.config(None))),
            )
            await self._update_settings(found, always=True)
            self._seen(found)
            return False
        kinds = drifts(self.config(None), found, self.floor)
        if not kinds:
            assert found is not None
            await self._update_settings(found)
            self._seen(found)
            return False
        if self.floor is None:
            assert found is not None  # neither known: created above
            start = _ack_floor(found) + 1
        else:
            start = self.floor + 1
        for kind in kinds:
            self.metrics.consumer_drift.labels(self.durable, kind).inc()
        log.error(
            "durable consumer changed behind the service's back, restoring it",
            consumer=self.durable,
            drift=kinds,
            found=None if found is None else _described(found),
            start=start,
        )
        if found is not None:
            with contextlib.suppress(NotFoundError):  # a sibling replica's restore deleted it
                await self._call(self.js.delete_consumer(self.stream, self.durable))
        self._seen(await self._create(start))
        return True

    async def _info(self) -> ConsumerInfo | None:
        try:
            return await self._call(self.js.consumer_info(self.stream, self.durable))
        except NotFoundError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                raise EventStoreError(
                    f"stream {self.stream} does not exist: create it with "
                    "`egress-proxies streams init`"
                ) from exc
            return None

    async def _create(self, start: int | None) -> ConsumerInfo:
        try:
            return await self._call(self.js.add_consumer(self.stream, self.config(start)))
        except NotFoundError as exc:
            raise StoreUnavailable(f"creating durable {self.durable}: {exc}") from exc

    async def _update_settings(self, found: ConsumerInfo, *, always: bool = False) -> None:
        """A new version's ack wait, limits or filter, applied in place (the start stays as it
        is)."""
        config = found.config
        start = config.opt_start_seq if config.deliver_policy != DeliverPolicy.ALL else None
        declared = self.config(start)
        if not always and all(getattr(config, n) == getattr(declared, n) for n in SETTINGS):
            return
        await self._call(self.js.add_consumer(self.stream, declared))

    def _seen(self, info: ConsumerInfo) -> None:
        self.floor = _ack_floor(info)

    async def _call(self, request: Awaitable[T]) -> T:
        """Our errors for the client library's: a check that cannot reach the server fails
        like any other read of the log, and the loop tries again. "Not found" is for the
        caller to read."""
        try:
            return await request
        except NotFoundError:
            raise
        except (nats.errors.Error, TimeoutError) as exc:
            raise StoreUnavailable(f"checking durable {self.durable}: {exc}") from exc


def _ack_floor(info: ConsumerInfo) -> int:
    return int(info.ack_floor.stream_seq if info.ack_floor else 0)


def _described(info: ConsumerInfo) -> dict[str, object]:
    config = info.config
    return {
        "filter": sorted(filters(config)),
        "deliver_policy": str(config.deliver_policy),
        "ack_policy": str(config.ack_policy),
        "opt_start_seq": config.opt_start_seq,
        "created": str(info.created),
    }
