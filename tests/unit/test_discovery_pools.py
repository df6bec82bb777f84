"""The pool rules of the discovery API without servers: what ``pool`` may be, the selector a
pool request leases with, and when a pool counts as scaling (the word a 503 says)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from events.pool import PoolDecided, PoolDeclared, PoolMember, PoolScaled, PoolSpec
from events.schemas import Event, HealthChanged, LeaseAcquired, ProxySpec
from events.store import Recorded
from projections import pool_members
from projections.pool import PoolView, fold
from projections.pool_members import MemberState
from services.discovery.pure.pools import conditions, pool_selector, summarize, template_misses
from services.runtime.pure.poolref import MAX_POOL_REF, PoolRef, parse_pool_ref
from tests.support.hand_views import Fleet

AT = datetime(2026, 1, 1, tzinfo=UTC)
MEMBERS = tuple(
    PoolMember(ordinal=i, name=f"de-m{i}", uid=f"u{i}", provider=p)
    for i, p in enumerate(("a", "a", "b"))
)


def pool(*more: Event, replicas: int = 3) -> PoolView:
    spec = PoolSpec(
        replicas=replicas, template=ProxySpec(provider="local", attributes={"country": "de"})
    )
    events: list[Event] = [
        PoolDeclared(uid="p", namespace="crawl", name="de", spec=spec),
        PoolDecided(uid="p", reason="ScaleUp", added=MEMBERS),
        *more,
    ]
    recorded = [Recorded(e, i + 1, f"pool.p.{e.category}", AT) for i, e in enumerate(events)]  # type: ignore[arg-type]
    view = fold(recorded)
    assert view is not None
    return view


def ready(*uids: str) -> dict[str, MemberState]:
    return {u: MemberState(uid=u, declared=True, ready=True, healthy=True) for u in uids}


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("crawl/de", PoolRef("crawl", "de")),
        ("de", PoolRef("default", "de")),
        ("a-1/b-2", PoolRef("a-1", "b-2")),
        (f"{'n' * 63}/{'p' * 57}", PoolRef("n" * 63, "p" * 57)),
    ],
)
def test_a_pool_is_namespace_slash_name_or_a_name_in_default(text: str, ref: PoolRef) -> None:
    assert parse_pool_ref(text) == ref
    assert len(text) <= MAX_POOL_REF


@pytest.mark.parametrize(
    "text",
    ["", "/", "a/b/c", "../x", "/de", "crawl/", "Crawl/de", "crawl/de\n", "crawl /de", "p" * 58],
)
def test_what_cannot_name_a_pool_is_refused_with_the_rule(text: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_pool_ref(text)


def test_a_pool_request_leases_with_the_pools_attribute_unless_the_selector_names_another() -> None:
    ref = PoolRef("crawl", "de")
    assert pool_selector({"tier": "gold"}, ref) == {"tier": "gold", "pool": "de"}
    assert pool_selector({"pool": "de"}, ref) == {"pool": "de"}
    with pytest.raises(ValueError, match="'us'"):
        pool_selector({"pool": "us"}, ref)


def test_a_selector_the_template_cannot_give_is_named() -> None:
    assert template_misses(pool(), {"country": "de", "pool": "de"}) == {}
    assert template_misses(pool(), {"country": "fr", "tier": "x"}) == {"country": "fr", "tier": "x"}


def test_scaling_is_members_to_come_or_not_ready_yet() -> None:
    short = summarize(pool(), ready("u0", "u1"), available=["u0", "nobody"])
    assert short.scaling
    assert (short.figures.members, short.figures.ready, short.available) == (3, 2, 1)
    assert {k: (c.members, c.ready) for k, c in short.providers.items()} == {
        "a": (2, 2),
        "b": (1, 0),
    }
    assert [(c.type, c.status, c.reason) for c in conditions(pool(), short)] == [
        ("Ready", "False", "Scaling"),
        ("Scaling", "True", "MembersNotReady"),
    ]
    full = summarize(pool(), ready("u0", "u1", "u2"), available=[])
    assert not full.scaling
    assert [c.status for c in conditions(pool(), full)] == ["True", "False"]
    grown = pool(PoolScaled(uid="p", replicas=5))
    more = summarize(grown, ready("u0", "u1", "u2"), available=[])
    assert more.scaling
    assert conditions(grown, more)[1].reason == "ScaleUp"
    # Retiring a surplus brings nothing: a 503 then is not "scaling".
    shrunk = pool(PoolScaled(uid="p", replicas=1))
    less = summarize(shrunk, ready("u0", "u1", "u2"), available=[])
    assert not less.scaling
    assert conditions(shrunk, less)[1].reason == "ScaleDown"


def test_members_are_counted_from_the_shared_views() -> None:
    """One count (``projections.pool_members``) for discovery and the pool controller: a leased
    member, an unhealthy one and one not declared yet."""
    now = datetime.now(UTC)
    fleet = (
        Fleet()
        .proxy("u0", {"pool": "de"})
        .proxy("u1", {"pool": "de"}, HealthChanged(healthy=False))
        .lease("u0", LeaseAcquired(lease_id="l", proxy_uid="u0", ttl_seconds=60), now)
    )
    views = fleet.views
    ours = {}
    for uid in ("u0", "u1", "u2"):
        ours[uid] = pool_members.member_state(uid, views.proxy(uid), views.lease_view(uid), now)
    assert (ours["u0"].leased, ours["u1"].healthy, ours["u2"].declared) == (True, False, False)
    seen = pool_members.figures(pool(), ours)
    assert (seen.members, seen.ready, seen.healthy, seen.leased) == (3, 2, 1, 1)
