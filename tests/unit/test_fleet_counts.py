"""``count_fleet``: what the fleet gauges say about each kind of proxy, at one instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events.schemas import Phase, ProxySpec
from projections.lease import LeaseView
from projections.outcomes import Backoff, Reports
from projections.proxy import ProxyView
from services.discovery.pure.fleet import PROXY_GAUGES, count_fleet
from tests.support.hand_views import held_lease

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def proxy(
    uid: str,
    provider: str = "gcp",
    *,
    phase: Phase = Phase.READY,
    healthy: bool | None = True,
    removed: bool = False,
) -> ProxyView:
    return ProxyView(
        uid=uid,
        spec=ProxySpec(provider=provider),
        phase=phase,
        url="http://10.0.0.1:3128" if phase is Phase.READY else "",
        healthy=healthy,
        removed=removed,
    )


def held(uid: str, *, expires_in: float, cooldown: float = 0.0) -> LeaseView:
    return held_lease(uid, NOW, ends_in=expires_in, cooldown=cooldown)


def backed_off(uid: str, *, until_in: float) -> LeaseView:
    backoff = Backoff(
        target="example.com",
        blocks=1,
        until=NOW + timedelta(seconds=until_in),
        reported_at=NOW - timedelta(seconds=1),
    )
    return LeaseView(proxy_uid=uid, reports=Reports(blocked=1, backoffs={"example.com": backoff}))


def test_each_kind_of_proxy_is_counted_where_it_belongs() -> None:
    proxies = [
        proxy("free"),
        proxy("leased"),
        proxy("expired-resting"),
        proxy("released-resting"),
        proxy("rested"),
        proxy("blocked"),
        proxy("block-over"),
        proxy("sick", healthy=False),
        proxy("new", phase=Phase.PROVISIONING, healthy=None),
        proxy("gone", removed=True),
        proxy("kvm-1", "kvm", phase=Phase.FAILED, healthy=False),
    ]
    leases = {
        "leased": held("leased", expires_in=30),
        # Past its end with no event ending it: free, resting for its cooldown.
        "expired-resting": held("expired-resting", expires_in=-1, cooldown=10),
        "released-resting": LeaseView(
            proxy_uid="released-resting", cooldown_until=NOW + timedelta(seconds=5)
        ),
        "rested": LeaseView(proxy_uid="rested", cooldown_until=NOW - timedelta(seconds=5)),
        "blocked": backed_off("blocked", until_in=60),
        "block-over": backed_off("block-over", until_in=-60),
        "gone": held("gone", expires_in=30),
    }
    counts = count_fleet(proxies, leases, NOW)
    assert counts.by_provider["gcp"] == {
        "healthy": 7,  # free, leased, both resting, rested, blocked, block-over
        "unhealthy": 1,
        "leased": 1,
        # A back-off is per target: a request without one gets the proxy.
        "available": 4,  # free, rested, blocked, block-over
        "cooling_down": 2,
        "backoff": 1,
    }
    assert counts.by_provider["kvm"] == {**dict.fromkeys(PROXY_GAUGES, 0), "unhealthy": 1}
    assert counts.phases["gcp", "Ready"] == 8
    assert counts.phases["gcp", "Provisioning"] == 1
    assert counts.phases["kvm", "Failed"] == 1
    # Every phase of every provider, zeros too, so a series never vanishes from a dashboard.
    assert set(counts.phases) == {(p, phase.value) for p in ("gcp", "kvm") for phase in Phase}
    assert counts.phases["kvm", "Ready"] == 0


def test_an_empty_fleet_has_no_series() -> None:
    counts = count_fleet([proxy("gone", removed=True)], {}, NOW)
    assert counts.phases == {}
    assert counts.by_provider == {}


LEASED = held("p", expires_in=30)
RESTING = held("p", expires_in=-1, cooldown=10)
RESTED = held("p", expires_in=-20, cooldown=10)
UP, FREE, SICK = "healthy", "available", "unhealthy"
GAUGES_OF = [
    # (row, the proxy, its lease view, held back for its egress, the gauges it counts in)
    ("free", proxy("p"), None, False, {UP, FREE}),
    ("held-back-for-egress", proxy("p"), None, True, {UP}),
    ("leased", proxy("p"), LEASED, False, {UP, "leased"}),
    ("resting", proxy("p"), RESTING, False, {UP, "cooling_down"}),
    ("rested", proxy("p"), RESTED, False, {UP, FREE}),
    ("backed-off", proxy("p"), backed_off("p", until_in=60), False, {UP, FREE, "backoff"}),
    ("back-off-over", proxy("p"), backed_off("p", until_in=-1), False, {UP, FREE}),
    ("unhealthy", proxy("p", healthy=False), None, False, {SICK}),
    ("not-probed", proxy("p", healthy=None), None, False, set()),
    ("provisioning", proxy("p", phase=Phase.PROVISIONING, healthy=None), None, False, set()),
    ("leased-and-unhealthy", proxy("p", healthy=False), LEASED, False, {SICK, "leased"}),
]


@pytest.mark.parametrize(
    ("view", "lease", "held_back", "gauges"),
    [row[1:] for row in GAUGES_OF],
    ids=[row[0] for row in GAUGES_OF],
)
def test_one_proxy_counts_in_its_gauges(
    view: ProxyView, lease: LeaseView | None, held_back: bool, gauges: set[str]
) -> None:
    leases = {} if lease is None else {"p": lease}
    counts = count_fleet([view], leases, NOW, {"p"} if held_back else frozenset())
    assert {name for name, n in counts.by_provider["gcp"].items() if n} == gauges
    assert sum(counts.phases.values()) == 1
    assert counts.phases["gcp", view.phase.value] == 1
