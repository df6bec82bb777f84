"""A throttled cloud API says when to come back (HTTP 429's ``Retry-After``, a rate limit's
reset time): the executor waits at least that long before the next call, so its retries are not
refused again; a hostile or broken value cannot park a command beyond ``MAX_RETRY_AFTER``."""

from __future__ import annotations

import math
from typing import cast

import pytest
from nats.aio.msg import Msg

from services.executor.commands import CommandHandler
from services.providers.base import (
    MAX_RETRY_AFTER,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.nats.consumer import Delivery, Retry
from services.runtime.observability.metrics import Metrics
from services.testing.provider import FakeProvider
from tests.support.executor_harness import FAST, create, declare, history, send


async def first_outcome(error: ProviderError) -> object:
    store = InMemoryEventStore()
    fake = FakeProvider()
    fake.inject("create", error)
    handler = CommandHandler(store, {"fake": fake}, policy=FAST, metrics=Metrics())
    await declare(store, "u1")
    await send(store, "u1", create())
    command = (await history(store, "u1"))[-1]
    return await handler(Delivery(command, 1, cast(Msg, None)))


@pytest.mark.parametrize(
    ("error", "delay"),
    [
        (Transient("429 Too Many Requests", retry_after=42.0), 42.0),
        (Transient("503"), FAST.backoff(1)),
        (QuotaExceeded("droplet limit", retry_after=300.0), 300.0),
        (QuotaExceeded("droplet limit"), FAST.quota_delay),
    ],
    ids=["transient-says", "transient-silent", "quota-says", "quota-silent"],
)
async def test_the_wait_is_at_least_what_the_cloud_asked(
    error: ProviderError, delay: float
) -> None:
    outcome = await first_outcome(error)
    assert isinstance(outcome, Retry)
    assert outcome.delay == pytest.approx(delay)


@pytest.mark.parametrize(
    ("asked", "read"),
    [
        (math.nan, 0.0),
        (math.inf, 0.0),
        (-5.0, 0.0),
        (10.0**12, MAX_RETRY_AFTER),
        ("60", 0.0),
        (True, 0.0),
    ],
)
def test_a_hostile_retry_after_reads_as_finite_and_bounded(asked: object, read: float) -> None:
    error = Transient("throttled", retry_after=asked)  # type: ignore[arg-type]
    assert error.retry_after == read
    assert str(error) == "throttled"
