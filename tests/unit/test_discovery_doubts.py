"""A claim stored in the log whose confirmation then fails (the log went out of reach between
the two) is answered 503: it must be doubted like an append in doubt, so that it is withdrawn
once the log is back rather than left as a lease nobody was told about (a "ghost lease" of the
chaos soak)."""

from __future__ import annotations

import pytest

from events import subjects
from events.errors import StoreUnavailable
from events.schemas import LeaseAcquired
from projections.lease import LeaseView
from services.discovery.leasing.leases import Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics
from tests.support.hand_views import Fleet


class LogLostAfterTheClaim(Views):
    """The projector lags behind the stored claim, and the log is gone when read directly."""

    async def wait_for_lease_seq(self, seq: int, timeout: float) -> None:
        raise TimeoutError

    async def fresh_lease_view(self, uid: str) -> LeaseView | None:
        raise StoreUnavailable("nats-server went away")


def leases_on(views: Views, store: InMemoryEventStore) -> Leases:
    return Leases(store, views, LeasePolicy(), DiscoveryMetrics(Metrics().registry))


@pytest.mark.parametrize("key", [None, "retry-me"])
async def test_a_claim_stored_then_unconfirmed_is_doubted_unless_keyed(key: str | None) -> None:
    store = InMemoryEventStore()
    views = LogLostAfterTheClaim(None, store)  # type: ignore[arg-type]
    Fleet(views).proxy("p1", {"country": "de"})
    leases = leases_on(views, store)
    with pytest.raises(StoreUnavailable):
        await leases.acquire({"country": "de"}, 60, "crawler", key=key)
    history = await store.read(subjects.lease("p1"))
    [claimed] = [r for r in history.events if isinstance(r.event, LeaseAcquired)]
    assert isinstance(claimed.event, LeaseAcquired)
    if key:
        # Its requester retries with the key and learns the lease: nothing to withdraw.
        assert leases.withdrawals.doubts == {}
    else:
        doubt = leases.withdrawals.doubts[claimed.event.lease_id]
        assert (doubt.proxy_uid, doubt.after_seq) == ("p1", claimed.seq - 1)
