"""The console's pools pages, pure: figures and members judged as the controller judges them,
the fleet's pool filter, the scaling timeline, and every name from the log rendered inert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import escape

from events.pool import (
    PoolDecided,
    PoolDeclared,
    PoolFigures,
    PoolMember,
    PoolRemoved,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
    SpreadEntry,
)
from events.schemas import (
    HealthChanged,
    LeaseAcquired,
    Phase,
    PhaseChanged,
    PoolEvent,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxySpec,
)
from events.store import Recorded, Unreadable
from projections import lease as lease_fold
from projections import pool as pool_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.pool import PoolView
from projections.proxy import ProxyView
from services.discovery.console.history import Cost
from services.discovery.console.pure.fleet import FilterError, counts, parse_filters, rows
from services.discovery.console.pure.pools import (
    NOT_DECLARED,
    READY,
    RETIRING,
    age,
    by_state,
    entry,
    members,
    membership,
    pool_line,
    pool_lines,
    spec_line,
    spread,
    timeline,
)
from services.discovery.console.render import page, pool_href, pool_path

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOSTILE = '<img src=x onerror="alert(1)">&amp;'


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _member(ordinal: int, provider: str = "local") -> PoolMember:
    return PoolMember(ordinal=ordinal, name=f"de-m{ordinal}", uid=f"m{ordinal}", provider=provider)


SPEC = PoolSpec(
    replicas=3,
    template=ProxySpec(provider="local", attributes={"country": "de"}),
    spread=(SpreadEntry(provider="local", weight=2), SpreadEntry(provider="gcp", weight=1)),
    max_age_seconds=6 * 3600,
    max_surge=2,
)


def _pool(
    *later: PoolEvent, name: str = "de", namespace: str = "crawl", uid: str = "P"
) -> PoolView:
    """A pool with members m0, m1 (local) and m2 (gcp) planned, then ``later`` events."""
    declared = PoolDeclared(uid=uid, namespace=namespace, name=name, spec=SPEC)
    first = PoolDecided(
        uid=uid,
        reason="ScaleUp",
        message="added 3 (0 -> 3 of 3)",
        added=(_member(0), _member(1), _member(2, "gcp")),
        figures=PoolFigures(desired=3),
    )
    events = [declared, first, *later]
    recorded = [
        Recorded(e, seq, f"pool.{uid}.{getattr(e, 'category', 'declared')}", _at(seq))
        for seq, e in enumerate(events, start=1)
    ]
    view = pool_fold.fold(recorded)
    assert view is not None
    return view


def _proxy(uid: str, *, phase: Phase = Phase.READY, healthy: bool | None = True) -> ProxyView:
    spec = ProxySpec(provider="local", attributes={"country": "de", "pool": "de"})
    events = [
        Recorded(
            ProxyDeclared(
                uid=uid, namespace="crawl", name=f"de-{uid}", spec=spec, source="pool/crawl/de"
            ),
            1,
            f"proxy.{uid}.declared",
            _at(10),
        ),
        Recorded(
            PhaseChanged(phase=phase, ip="10.0.0.1", url="http://10.0.0.1:3128"),
            2,
            f"proxy.{uid}.status",
            _at(11),
        ),
    ]
    if healthy is not None:
        events.append(
            Recorded(
                HealthChanged(healthy=healthy, latency_ms=3.0), 3, f"proxy.{uid}.health", _at(12)
            )
        )
    view = proxy_fold.fold(events)
    assert view is not None
    return view


def _leased(uid: str, holder: str) -> LeaseView:
    acquired = LeaseAcquired(lease_id=f"l-{uid}", proxy_uid=uid, holder=holder, ttl_seconds=600)
    view = lease_fold.fold([Recorded(acquired, 20, f"lease.{uid}", _at(20))])
    assert view is not None
    return view


def test_a_pools_figures_are_the_controllers_and_the_apis() -> None:
    pool = _pool()
    proxies = {"m0": _proxy("m0"), "m1": _proxy("m1", phase=Phase.PROVISIONING, healthy=None)}
    leases = {"m0": _leased("m0", "crawler")}
    line = pool_line(pool, proxies, leases, _at(60))
    seen = line.figures
    assert (seen.desired, seen.members, seen.ready, seen.healthy, seen.leased) == (3, 3, 1, 1, 1)
    assert line.available == 0  # the one Ready member is leased
    assert line.scaling
    assert {c.type: c.status for c in line.conditions} == {"Ready": "False", "Scaling": "True"}
    assert line.providers["local"].members == 2
    assert line.providers["gcp"].ready == 0
    after = pool_line(pool, proxies, leases, _at(700))  # the lease ran out
    assert (after.figures.leased, after.available) == (0, 1)


def test_the_pools_listed_leave_out_the_removed_and_sort_by_namespace_and_name() -> None:
    gone = _pool(PoolRemoved(uid="Z"), name="gone", uid="Z")
    listed = pool_lines(
        [_pool(name="us", uid="U"), gone, _pool(name="de", namespace="a", uid="A")],
        {},
        {},
        _at(60),
    )
    assert [ln.ref for ln in listed] == ["a/de", "crawl/us"]


def test_members_are_listed_by_state_then_ordinal() -> None:
    pool = _pool(PoolDecided(uid="P", reason="ScaleDown", retired=("m0",)))
    proxies = {
        "m0": _proxy("m0"),  # retired, its Proxy not removed yet
        "m1": _proxy("m1", phase=Phase.PROVISIONING, healthy=None),
    }
    leases = {"m1": _leased("m1", HOSTILE)}
    shown = members(pool, proxies, leases, _at(70))
    assert [(m.uid, m.state) for m in shown] == [
        ("m1", "Provisioning"),
        ("m2", NOT_DECLARED),
        ("m0", RETIRING),
    ]
    m1 = shown[0]
    assert (m1.leased, m1.holder, m1.health, m1.provider) == (True, HOSTILE, "unknown", "local")
    assert not shown[1].declared
    assert shown[1].health == ""
    assert by_state(shown) == [("Provisioning", 1), (NOT_DECLARED, 1), (RETIRING, 1)]
    ready = members(_pool(), {"m2": _proxy("m2")}, {}, _at(70))
    assert [(m.uid, m.state) for m in ready][:1] == [("m2", READY)]
    assert age(ready[0].since, _at(70)) == "1m"


def test_a_member_being_deleted_says_so() -> None:
    deleting = proxy_fold.apply(
        _proxy("m0"), Recorded(ProxyDeletionRequested(uid="m0"), 9, "proxy.m0.declared", _at(30))
    )
    shown = {m.uid: m.state for m in members(_pool(), {"m0": deleting}, {}, _at(40))}
    assert shown["m0"] == "deleting"


def test_the_spread_lists_the_specs_providers_then_any_other() -> None:
    pool = _pool(PoolDecided(uid="P", reason="Spread", added=(_member(3, "old"),)))
    line = pool_line(pool, {}, {}, _at(60))
    got = [(s.provider, s.weight, s.members) for s in spread(pool, line.providers)]
    assert got == [("local", 2, 2), ("gcp", 1, 1), ("old", 0, 1)]
    plain = PoolSpec(replicas=1, template=ProxySpec(provider="kvm"))
    bare = pool_fold.fold(
        [
            Recorded(
                PoolDeclared(uid="B", namespace="n", name="b", spec=plain), 1, "pool.B.declared", T0
            )
        ]
    )
    assert bare is not None
    assert [(s.provider, s.weight, s.members) for s in spread(bare, {})] == [("kvm", 1, 0)]


def test_the_timeline_says_each_decision_with_its_reason_figures_and_changes() -> None:
    seen = PoolFigures(desired=5, members=3, ready=3, healthy=2, leased=1)
    decided = PoolDecided(
        uid="P",
        reason="ScaleUp",
        message="added 2",
        added=(_member(3), _member(4)),
        retired=("m0",),
        figures=seen,
    )
    events = [
        Recorded(PoolScaled(uid="P", replicas=5), 3, "pool.P.declared", _at(3)),
        Recorded(decided, 4, "pool.P.decision", _at(4)),
        Recorded(PoolSpecChanged(uid="P", spec=SPEC, generation=2), 5, "pool.P.declared", _at(5)),
        Recorded(Unreadable(type="PoolX", reason="unknown type"), 6, "pool.P.decision", _at(6)),
    ]
    entries, left_out = timeline(events)
    assert left_out == 0
    assert [e.type for e in entries] == ["PoolX", "PoolSpecChanged", "PoolDecided", "PoolScaled"]
    skipped, changed, scale_up, scaled = entries
    assert (scale_up.reason, scale_up.message, scale_up.figures) == ("ScaleUp", "added 2", seen)
    assert scale_up.changes == "added 2, retired 1"
    assert (scaled.reason, scaled.message, scaled.figures) == ("Scaled", "to 5 replicas", None)
    assert changed.message == "generation 2: " + spec_line(SPEC)
    assert "spread local:2, gcp:1" in changed.message
    assert "maxAge 6h" in changed.message
    assert skipped.reason == "Skipped"
    newest, older = timeline(events, limit=1)
    assert ([e.seq for e in newest], older) == ([6], 3)
    long = entry(Recorded(PoolDecided(uid="P", reason="X", message="y" * 1000), 7, "s", T0))
    assert len(long.message) <= 240


def test_the_fleet_filters_a_pools_members_only() -> None:
    pool = _pool()
    stranger = _proxy("s")  # the members' very attributes, planned by no pool
    member_of = membership([pool])
    every = rows([_proxy("m0"), _proxy("m1"), stranger], {}, _at(60), member_of)
    assert [(r.uid, r.pool) for r in every] == [("m0", "crawl/de"), ("m1", "crawl/de"), ("s", "")]
    wanted = parse_filters([("pool", "crawl/de")])
    assert [r.uid for r in every if wanted.matches(r)] == ["m0", "m1"]
    assert parse_filters(wanted.query()) == wanted
    assert parse_filters([("pool", "de")]).pool == "default/de"  # as a lease request reads it
    assert parse_filters([("pool", "")]).pool == ""
    assert counts(every, every).pools == ("crawl/de",)
    with pytest.raises(FilterError, match=r"^pool: .*NAMESPACE/NAME"):
        parse_filters([("pool", "a/b/c")])
    with pytest.raises(FilterError, match="pool=NAMESPACE/NAME"):
        parse_filters([("pools", "crawl/de")])


def test_pool_paths_quote_each_part_whole() -> None:
    assert pool_path("crawl", "de") == "/ui/pools/crawl/de"
    assert pool_path("a/b", HOSTILE).startswith("/ui/pools/a%2Fb/%3Cimg%20src%3Dx")
    assert pool_href("crawl/de") == "/ui/pools/crawl/de"


def _pool_context(pool: PoolView, now: datetime) -> dict[str, object]:
    proxies = {"m0": _proxy("m0")}
    leases = {"m0": _leased("m0", HOSTILE)}
    line = pool_line(pool, proxies, leases, now)
    shown = members(pool, proxies, leases, now)
    assert pool.last_decision is not None
    events = [Recorded(pool.last_decision, 2, "pool.P.decision", _at(2))]
    entries, left_out = timeline(events)
    return {
        "title": f"{pool.namespace}/{pool.name}",
        "line": line,
        "pool": pool,
        "spec": spec_line(pool.spec),
        "created": age(pool.created_at, now),
        "members": shown,
        "states": by_state(shown),
        "spread": spread(pool, line.providers),
        "entries": entries,
        "left_out": left_out,
        "action": pool_path(pool.namespace, pool.name),
        "live_url": pool_path(pool.namespace, pool.name) + "/live",
        "at": None,
        "now": now,
        "cost": Cost(0, 0.0, (HOSTILE,)),
        "at_query": "",
        "signed_in": True,
    }


def test_hostile_names_render_inert_on_the_pools_pages() -> None:
    hostile_spec = PoolSpec(
        replicas=1,
        template=ProxySpec(provider="local", attributes={HOSTILE: HOSTILE}),
    )
    declared = PoolDeclared(
        uid="P", namespace=HOSTILE, name=HOSTILE, spec=hostile_spec, source=HOSTILE
    )
    decided = PoolDecided(uid="P", reason=HOSTILE, message=HOSTILE, added=(_member(0, "local"),))
    pool = pool_fold.fold(
        [
            Recorded(declared, 1, "pool.P.declared", _at(1)),
            Recorded(decided, 2, "pool.P.decision", _at(2)),
        ]
    )
    assert pool is not None
    now = _at(60)
    listing = page(
        "pools.html",
        lines=pool_lines([pool], {}, {}, now),
        live_url="/ui/pools/live",
        at=None,
        now=now,
        cost=Cost(0, 0.0),
        at_query="",
        signed_in=True,
    )
    detail = page("pool.html", **_pool_context(pool, now))
    for html in (listing, detail):
        assert HOSTILE not in html
        assert "<img" not in html
        assert 'onerror="' not in html
        assert str(escape(HOSTILE)) in html
    assert 'href="/ui/pools/%3Cimg' in listing  # the link stays a path of the console
    assert 'href="/ui/proxies/m0"' in detail
    assert '<a href="/ui/proxies/m1' not in detail  # no Proxy yet: nothing to link to
