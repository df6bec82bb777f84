"""Why a lease request got no proxy, without servers: 422 when nothing has the attributes, 503
with counts per reason when something does; and the Idempotency-Key's ids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from events.schemas import (
    HealthChanged,
    LeaseAcquired,
    LeaseReleased,
    Phase,
    PhaseChanged,
    ProxyDeletionRequested,
    ProxyRemoved,
)
from services.discovery.http.errors import NoMatchingProxy, NoProxyAvailable
from services.discovery.leasing.refusals import refusal
from services.discovery.pure.policy import Claim, LeasePolicy
from tests.support.hand_views import Fleet


def claim(lease_id: str, uid: str, ttl: float = 60, cooldown: float = 0) -> LeaseAcquired:
    return LeaseAcquired(
        lease_id=lease_id, proxy_uid=uid, ttl_seconds=ttl, cooldown_seconds=cooldown
    )


def test_nothing_with_the_attributes_is_422_naming_what_exists() -> None:
    fleet = Fleet().proxy("a", {"country": "de", "tier": "gold"}).proxy("b", {"country": "us"})
    error = refusal(fleet.views, {"contry": "de"})
    assert isinstance(error, NoMatchingProxy)
    assert (error.status, error.code, error.headers) == (422, "no_matching_proxy", {})
    assert "did you mean 'country'?" in error.message
    assert "the attribute keys in use are 'country', 'tier'" in error.message
    wrong_value = refusal(fleet.views, {"country": "fr"}).message
    assert "'country' is one of 'de', 'us'" in wrong_value
    apart = refusal(fleet.views, {"country": "us", "tier": "gold"})
    assert isinstance(apart, NoMatchingProxy)
    assert "no single proxy has all of them" in apart.message


def test_an_empty_fleet_says_so() -> None:
    error = refusal(Fleet().views, {})
    assert isinstance(error, NoMatchingProxy)
    assert "there are no proxies yet" in error.message


def test_a_removed_proxy_does_not_exist_but_one_being_deleted_does() -> None:
    fleet = Fleet().proxy("gone", {"pool": "x"}, ProxyDeletionRequested(uid="gone"))
    fleet.proxy("gone", {"pool": "x"}, ProxyRemoved(uid="gone"))
    assert isinstance(refusal(fleet.views, {"pool": "x"}), NoMatchingProxy)
    fleet.proxy("going", {"pool": "y"}, ProxyDeletionRequested(uid="going"))
    error = refusal(fleet.views, {"pool": "y"})
    assert isinstance(error, NoProxyAvailable)
    assert "1 being deleted" in error.message


def test_matching_but_none_leasable_is_503_counted_by_reason() -> None:
    fleet, now = Fleet(), datetime.now(UTC)
    fleet.proxy("leased", {"pool": "a"}).lease("leased", claim("l1", "leased", ttl=30), now)
    fleet.proxy("resting", {"pool": "a"}).lease("resting", claim("l2", "resting", cooldown=20), now)
    fleet.lease(
        "resting", LeaseReleased(lease_id="l2", proxy_uid="resting", cooldown_seconds=20), now
    )
    fleet.proxy("sick", {"pool": "a"}, HealthChanged(healthy=False, message="connect refused"))
    fleet.proxy("new", {"pool": "a"}, PhaseChanged(phase=Phase.PROVISIONING))
    fleet.proxy("other", {"pool": "b"})
    error = refusal(fleet.views, {"pool": "a"})
    assert isinstance(error, NoProxyAvailable)
    assert error.status == 503
    message = error.message
    assert message.startswith("4 proxies match the selector {'pool': 'a'}, but none")
    for part in (
        "1 leased",
        "1 cooling down",
        "1 unhealthy (last probe: connect refused)",
        "1 not Ready (Provisioning)",
    ):
        assert part in message, message
    # The soonest end: the cooldown, about 20 s away (the lease has 30 s left).
    assert 19 <= int(error.headers["Retry-After"]) <= 21


def test_only_unhealthy_matches_give_the_default_wait() -> None:
    fleet = Fleet().proxy("sick", {"pool": "a"}, HealthChanged(healthy=False, reason="Timeout"))
    error = refusal(fleet.views, {"pool": "a"})
    assert isinstance(error, NoProxyAvailable)
    assert error.headers == {"Retry-After": "5"}
    assert "1 unhealthy (last probe: Timeout)" in error.message


def test_the_index_tells_existing_from_leasable() -> None:
    fleet = Fleet().proxy("a", {"k": "v"}).proxy("b", {"k": "v"}, HealthChanged(healthy=False))
    index = fleet.views.candidates
    assert index.matching({"k": "v"}) == ["a"]
    assert index.existing({"k": "v"}) == ["a", "b"]
    assert index.existing({}) == ["a", "b"]
    assert index.attribute_values() == {"k": {"v"}}


# ----------------------------------------------------------------------- Idempotency-Key


def _claim(key: str, **changes: Any) -> Claim:
    values: dict[str, Any] = {
        "selector": {"country": "de"},
        "ttl": 60.0,
        "requested_ttl": 60.0,
        "holder": "h",
        "key": key,
    }
    values.update(changes)
    return Claim(**values)


def test_a_key_fixes_the_lease_id_and_the_order_of_msg_ids() -> None:
    first, retry = _claim("k-1"), _claim("k-1", holder="other")
    assert first.lease_id == retry.lease_id
    assert len(first.lease_id) == 36  # a UUID, like the ids leases get without a key
    assert [first.msg_id("x", n) for n in range(3)] == [retry.msg_id("y", n) for n in range(3)]
    assert len({first.msg_id("x", n) for n in range(3)}) == 3
    assert _claim("k-2").lease_id != first.lease_id
    assert _claim("k-2").msg_id("x", 0) != first.msg_id("x", 0)
    plain = _claim("")
    assert plain.lease_id == ""
    assert plain.msg_id("l1", 0) == plain.msg_id("l1", 5) != plain.msg_id("l2", 0)


def test_a_deadline_is_the_append_timeout_plus_the_margin_ahead() -> None:
    policy = LeasePolicy(append_timeout=1.5, deadline_margin=1.0)
    now = datetime.now(UTC)
    assert policy.deadline(now) == now + timedelta(seconds=2.5)


@pytest.mark.parametrize("ahead", [0.0, 30.0])
def test_the_server_clock_estimate_follows_what_the_log_stamps(ahead: float) -> None:
    fleet = Fleet()
    stamp = datetime.now(UTC) + timedelta(seconds=ahead)
    fleet.lease("p1", claim("l1", "p1"), stamp)
    fleet.lease("p2", claim("l2", "p2"), datetime(2020, 1, 1, tzinfo=UTC))  # an old event
    estimate = fleet.views.server_now() - datetime.now(UTC)
    assert timedelta(seconds=ahead - 1) < estimate <= timedelta(seconds=ahead + 1)
