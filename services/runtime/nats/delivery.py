"""What the consumer loop (``services.runtime.nats.consumer``) is given and hands its handlers:
the durable's spec, a delivery, and what a handler may answer."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from events import codec, subjects
from events.schemas import AnyEvent
from events.store import Recorded
from services.runtime.nats.durable import RESTORED


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    ack_wait: float = 30.0
    max_deliver: int = 5
    batch: int = 64
    concurrency: int = 32
    fetch_timeout: float = 1.0
    retry_base: float = 0.5
    retry_max: float = 30.0
    key: Callable[[str], str] = subjects.proxy_uid_of
    check_interval: float = 15.0
    """Seconds between two checks that the durable is still as declared (``durable``)."""
    earlier_filters: tuple[tuple[str, ...], ...] = ()
    """The filters earlier versions declared: a durable found with one is a version's change,
    updated in place (from where it is), not a drift restored and counted."""

    def config(self, start: int | None = None) -> ConsumerConfig:
        """Delivering every message, or those from stream sequence ``start`` when the durable
        is restored (``services.runtime.nats.durable``), which its metadata says."""
        # The server never drops a message on its own (max_deliver -1): after our own limit the
        # loop writes it to DEADLETTER with the reason, which the server could not record.
        return ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL if start is None else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            metadata=None if start is None else {RESTORED: str(start)},
            ack_wait=self.ack_wait,
            max_deliver=-1,
            max_ack_pending=max(self.concurrency * 4, self.batch * 2),
            filter_subjects=list(self.filter_subjects),
        )


@dataclass(frozen=True, slots=True)
class Retry:
    """Handler outcome: not now; deliver again after ``delay`` seconds (counts a delivery)."""

    delay: float
    reason: str = ""


class GiveUp(Exception):
    """Raised by a handler for a message that can never succeed: dead-letter it at once."""


Outcome = Retry | None


@dataclass
class Delivery:
    recorded: Recorded
    attempt: int
    msg: Msg = field(repr=False)

    async def progress(self) -> None:
        """Tell JetStream the work goes on, so it does not redeliver to another replica."""
        with contextlib.suppress(nats.errors.Error):
            await self.msg.in_progress()


Handler = Callable[[Delivery], Awaitable[Outcome]]
Settle = Callable[[Delivery], bool]
"""Settles a delivery at once, without a task, when it needs no I/O (True), or declines it
with nothing changed (False), for the handler to have it as usual."""


def recorded_of(msg: Msg, headers: dict[str, str], event: AnyEvent) -> Recorded:
    meta = msg.metadata
    return Recorded(
        event=event,
        seq=meta.sequence.stream,
        subject=msg.subject,
        timestamp=meta.timestamp,
        msg_id=headers.get(codec.HDR_MSG_ID, ""),
        causation_id=headers.get(codec.HDR_CAUSATION, ""),
    )
