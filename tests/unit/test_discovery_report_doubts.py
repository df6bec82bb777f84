"""A report whose append is in doubt (the log went away after the message was sent: stored or
not, nobody knows) is answered by the truth, not by the lost acknowledgement: the same message
is appended again until the log answers, JetStream keeps it once, and the stored record says
whether it counts. A "ghost report" of the chaos soak was a report recorded while its request
was answered 503."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from events import subjects
from events.errors import NotSent, StoreUnavailable
from events.schemas import LeaseAcquired, LeaseReported
from events.store import AppendResult, NewEvent
from events.subjects import Aggregate
from projections.lease import LeaseView
from services.discovery.http.errors import Unavailable
from services.discovery.leasing.held_leases import HeldLeases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics
from tests.support.hand_views import Fleet


class Flaky(InMemoryEventStore):
    """The first ``losses`` appends fail as a killed nats-server makes them fail: sent, and
    stored (``stored=True``) or not, with the answer lost; then ``unsent`` more that find no
    connection (nothing leaves, nothing is stored)."""

    def __init__(self, losses: int, *, stored: bool, unsent: int = 0) -> None:
        super().__init__()
        self.losses = losses
        self.stored = stored
        self.unsent = unsent
        self.attempts = 0

    async def append(
        self, aggregate: Aggregate, events: Sequence[NewEvent], expected_seq: int | None = None
    ) -> AppendResult:
        self.attempts += 1
        if self.losses:
            self.losses -= 1
            if self.stored:
                await super().append(aggregate, events, expected_seq)
            raise StoreUnavailable("append: nats-server went away")
        if self.unsent:
            self.unsent -= 1
            raise NotSent("append: not connected to NATS")
        return await super().append(aggregate, events, expected_seq)


class Caught(Views):
    """A projector that is always caught up; reading the log directly may fail."""

    log_gone = False

    async def wait_for_lease_seq(self, seq: int, timeout: float) -> None:
        if self.log_gone:
            raise TimeoutError

    async def fresh_lease_view(self, uid: str) -> LeaseView | None:
        raise StoreUnavailable("nats-server went away")


def held(store: InMemoryEventStore, policy: LeasePolicy | None = None) -> tuple[HeldLeases, Caught]:
    views = Caught(None, store)  # type: ignore[arg-type]
    Fleet(views).proxy("p1", {"country": "de"}).lease(
        "p1", LeaseAcquired(lease_id="l1", proxy_uid="p1", ttl_seconds=600), datetime.now(UTC)
    )
    policy = policy or LeasePolicy(view_timeout=2.0)
    return HeldLeases(store, views, policy, DiscoveryMetrics(Metrics().registry)), views


async def reports_in(store: InMemoryEventStore) -> list[LeaseReported]:
    history = await store.read(subjects.lease("p1"))
    return [r.event for r in history.events if isinstance(r.event, LeaseReported)]


@pytest.mark.parametrize("stored", [True, False], ids=["stored-then-lost", "never-stored"])
async def test_a_report_in_doubt_is_appended_again_and_recorded_once(stored: bool) -> None:
    store = Flaky(losses=2, stored=stored)
    leases, _ = held(store)
    await leases.report("l1", "blocked", "shop.example", "captcha")
    [report] = await reports_in(store)
    assert (report.lease_id, report.outcome, report.detail) == ("l1", "blocked", "captcha")
    assert store.attempts == 3


async def test_a_report_sent_then_unconnected_waits_for_the_log_and_is_recorded_once() -> None:
    store = Flaky(losses=1, stored=True, unsent=3)
    leases, _ = held(store)
    await leases.report("l1", "blocked", "shop.example", "reconnected")
    assert [r.detail for r in await reports_in(store)] == ["reconnected"]
    assert store.attempts == 5


async def test_a_report_that_never_left_fails_at_once() -> None:
    # No connection from the start: nothing was sent, nothing to doubt; the 503 is prompt.
    store = Flaky(losses=0, stored=False, unsent=10**6)
    leases, _ = held(store, LeasePolicy(view_timeout=30.0))
    with pytest.raises(NotSent):
        await leases.report("l1", "success", "shop.example", "")
    assert store.attempts == 1
    assert await reports_in(store) == []


async def test_a_report_the_log_never_answers_is_503_after_the_view_timeout() -> None:
    store = Flaky(losses=10**6, stored=False)
    leases, _ = held(store, LeasePolicy(view_timeout=0.5))
    with pytest.raises(StoreUnavailable):
        await leases.report("l1", "success", "shop.example", "")
    assert await reports_in(store) == []
    assert 2 <= store.attempts <= 10


async def test_a_report_stored_after_its_deadline_is_not_counted_and_says_so() -> None:
    # A deadline already past when the message is stored: the fold ignores the report as late,
    # so after the doubt the answer is the 503 of a write that did not count.
    store = Flaky(losses=1, stored=True)
    leases, _ = held(store, LeasePolicy(view_timeout=2.0, append_timeout=0.0, deadline_margin=-5))
    with pytest.raises(Unavailable, match="after its deadline and was not counted"):
        await leases.report("l1", "blocked", "shop.example", "late")
    assert len(await reports_in(store)) == 1


async def test_a_report_recorded_is_204_even_when_the_view_cannot_be_read_after() -> None:
    store = InMemoryEventStore()
    leases, views = held(store)
    views.log_gone = True
    await leases.report("l1", "success", "shop.example", "read-after-failed")
    assert [r.detail for r in await reports_in(store)] == ["read-after-failed"]
