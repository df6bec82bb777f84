"""The console's pure parts: rows, filters and counts, timeline lines, escaping, instants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from markupsafe import escape

from events.schemas import (
    HealthChanged,
    LeaseAcquired,
    LeaseReported,
    Phase,
    PhaseChanged,
    ProxyDeclared,
    ProxySpec,
)
from events.store import Recorded, Unreadable
from projections import lease as lease_fold
from projections import proxy as proxy_fold
from projections.lease import LeaseView
from projections.proxy import ProxyView
from services.discovery.console.history import Cost
from services.discovery.console.pure.fleet import (
    FilterError,
    Filters,
    counts,
    parse_filters,
    rows,
)
from services.discovery.console.pure.fleet_page import one_page
from services.discovery.console.pure.timeline import line, merged, summary
from services.discovery.console.render import page, query, until
from services.runtime.eventlog.asof import Stored, parse_instant, trace_id

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOSTILE = '<img src=x onerror="alert(1)">&amp;'


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _proxy(uid: str, attributes: dict[str, str], *, healthy: bool | None) -> ProxyView:
    spec = ProxySpec(provider="local", attributes=attributes)
    events: list[Recorded] = [
        Recorded(
            ProxyDeclared(uid=uid, namespace="crawl", name=uid, spec=spec),
            1,
            f"proxy.{uid}.declared",
            _at(0),
        ),
        Recorded(
            PhaseChanged(phase=Phase.READY, ip="10.0.0.1", url="http://10.0.0.1:3128"),
            2,
            f"proxy.{uid}.status",
            _at(1),
        ),
    ]
    if healthy is not None:
        verdict = HealthChanged(healthy=healthy, latency_ms=7.0, message="refused")
        events.append(Recorded(verdict, 3, f"proxy.{uid}.health", _at(2)))
    view = proxy_fold.fold(events)
    assert view is not None
    return view


def _leased(uid: str, holder: str) -> LeaseView:
    acquired = LeaseAcquired(lease_id="l1", proxy_uid=uid, holder=holder, ttl_seconds=60)
    view = lease_fold.fold([Recorded(acquired, 10, f"lease.{uid}", _at(10))])
    assert view is not None
    return view


def test_rows_judge_leases_at_the_instant_given() -> None:
    proxies = [_proxy("b", {"country": "de"}, healthy=True), _proxy("a", {}, healthy=None)]
    leases = {"b": _leased("b", "crawler")}
    during = rows(proxies, leases, _at(30))
    assert [r.uid for r in during] == ["a", "b"]
    b = during[1]
    assert (b.leased, b.holder, b.expires_at, b.available) == (True, "crawler", _at(70), False)
    assert b.latency_ms == 7.0
    after = rows(proxies, leases, _at(71))[1]
    assert (after.leased, after.holder, after.available) == (False, "", True)
    assert during[0].health == "unknown"
    assert not during[0].available


def test_filters_parse_match_and_round_trip() -> None:
    proxies = [
        _proxy("a", {"country": "de", "tier": "gold"}, healthy=True),
        _proxy("b", {"country": "fr"}, healthy=False),
    ]
    every = rows(proxies, {}, _at(30))
    wanted = parse_filters(
        [("phase", "ready"), ("attrs", "country=de, tier=gold"), ("at", "x")], allowed=("at",)
    )
    assert wanted == Filters(phase="Ready", attributes=(("country", "de"), ("tier", "gold")))
    assert [r.uid for r in every if wanted.matches(r)] == ["a"]
    assert parse_filters(wanted.query()) == wanted
    sick = parse_filters([("health", "unhealthy"), ("attr.country", "fr"), ("provider", "local")])
    assert [r.uid for r in every if sick.matches(r)] == ["b"]
    assert parse_filters([("phase", ""), ("health", "")]) == Filters()
    for bad, named in (
        ([("colour", "red")], "'colour'"),
        ([("phase", "Sleeping")], "phase:"),
        ([("health", "meh")], "health:"),
        ([("attrs", "country")], "attrs:"),
    ):
        with pytest.raises(FilterError, match=named):
            parse_filters(bad)
    summary_ = counts([every[0]], every)
    assert (summary_.shown, summary_.total, summary_.healthy, summary_.unhealthy) == (1, 2, 1, 0)
    assert summary_.phases == {"Ready": 1}
    assert summary_.providers == ("local",)


def test_timeline_lines_summarise_each_event() -> None:
    report = LeaseReported(
        lease_id="l1", proxy_uid="p", outcome="blocked", target="shop.example", detail="HTTP 403"
    )
    recorded = Recorded(report, 5, "lease.p", _at(5), causation_id="c-1")
    got = line(recorded, "LEASE", "ab" * 16)
    assert (got.type, got.kind, got.trace_id, got.causation_id) == (
        "LeaseReported",
        "lease",
        "ab" * 16,
        "c-1",
    )
    assert got.summary == "report blocked for shop.example: HTTP 403"
    assert summary(HealthChanged(healthy=False, message="refused")) == "unhealthy: refused"
    assert summary(HealthChanged(healthy=True, latency_ms=12.4)) == "healthy, 12 ms"
    skipped = line(
        Recorded(Unreadable(type="Future", reason="unknown_type"), 6, "proxy.p.status", _at(6)),
        "PROXY",
    )
    assert (skipped.kind, skipped.type, skipped.summary) == (
        "skipped",
        "Future",
        "skipped (unknown_type): Future",
    )
    long = summary(HealthChanged(healthy=False, message="x" * 1000))
    assert (
        len(
            line(
                Recorded(
                    HealthChanged(healthy=False, message="x\n" * 500), 7, "proxy.p.health", _at(7)
                ),
                "PROXY",
            ).summary
        )
        <= 240
    )
    assert len(long) > 240
    newest, left = merged([got, skipped], limit=1)
    assert newest == [skipped]
    assert left == 1


def test_hostile_text_is_escaped_on_every_page() -> None:
    proxy = _proxy("p", {HOSTILE: HOSTILE}, healthy=False)
    proxy = proxy_fold.apply(
        proxy, Recorded(HealthChanged(healthy=False, message=HOSTILE), 4, "proxy.p.health", _at(3))
    )
    leases = {"p": _leased("p", HOSTILE)}
    every = rows([proxy], leases, _at(30))
    context = {
        "rows": every,
        "counts": counts(every, every),
        "filters": Filters(attributes=((HOSTILE, HOSTILE),)),
        "phases": ("Ready",),
        "healths": ("healthy",),
        "providers": (HOSTILE,),
        "at": None,
        "now": _at(30),
        "cost": Cost(0, 0.0),
        "live_url": "/ui/live" + query([("attrs", HOSTILE)]),
        "at_query": "",
        "signed_in": True,
        **one_page(every),
    }
    html = page("fleet.html", **context)
    lines = [
        line(
            Recorded(
                LeaseReported(lease_id="l1", proxy_uid="p", outcome="failed", detail=HOSTILE),
                9,
                "lease.p",
                _at(9),
            ),
            "LEASE",
            HOSTILE,
        )
    ]
    proxy_html = page(
        "proxy.html",
        title=HOSTILE,
        proxy=proxy,
        row=every[0],
        lines=lines,
        left_out=0,
        at=_at(40),
        now=_at(40),
        cost=Cost(3, 0.01, (HOSTILE,)),
        action="/ui/proxies/p",
        live_url="",
        at_query="",
        signed_in=False,
        traffic={"refused": HOSTILE, "own": HOSTILE},  # the panel's own: test_console_traffic
    )
    login = page("login.html", next=HOSTILE, error=HOSTILE, signed_in=False)
    for text in (html, proxy_html, login):
        assert HOSTILE not in text
        assert "<img" not in text
        assert 'onerror="' not in text
        assert str(escape(HOSTILE)) in text


def test_instants_and_trace_ids() -> None:
    assert parse_instant("2026-03-01T12:00:00Z") == T0
    assert parse_instant("2026-03-01T12:00") == T0  # a datetime-local value: UTC
    assert parse_instant("2026-03-01T13:00:00+01:00") == T0
    with pytest.raises(ValueError, match="until: 'soon' is not a time"):
        parse_instant("soon", "until")
    assert (
        trace_id({"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"})
        == "4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert trace_id({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) == ""
    assert trace_id({"traceparent": "garbage"}) == trace_id(None) == ""
    assert until(_at(90), _at(30)) == "in 1m"
    assert until(_at(0), _at(30)) == "30s ago"
    assert (
        Stored(
            Recorded(Unreadable(type="x", reason="undecodable"), 1, "proxy.p.status", T0)
        ).trace_id
        == ""
    )


def test_the_proxy_page_names_each_back_off_and_its_end() -> None:
    """An operator reads which sites blocked the proxy and until when, not a count."""
    proxy = _proxy("p", {}, healthy=True)
    view = lease_fold.fold(
        [
            Recorded(
                LeaseAcquired(lease_id="l1", proxy_uid="p", ttl_seconds=60), 10, "lease.p", _at(10)
            ),
            Recorded(
                LeaseReported(
                    lease_id="l1",
                    proxy_uid="p",
                    outcome="blocked",
                    target="shop.example",
                    backoff_seconds=600,
                ),
                11,
                "lease.p",
                _at(11),
            ),
        ]
    )
    assert view is not None
    (row,) = rows([proxy], {"p": view}, _at(100))
    assert row.backoffs == (("shop.example", _at(611)),)
    html = page(
        "proxy.html",
        title="p",
        proxy=proxy,
        row=row,
        lines=[],
        left_out=0,
        at=None,
        now=_at(100),
        cost=Cost(0, 0.0),
        action="/ui/proxies/p",
        live_url="",
        at_query="",
        signed_in=False,
        traffic={"refused": "busy", "own": None},
    )
    assert "in back-off for <span" in html
    assert "shop.example</span> until 2026-03-01 12:10:11 (in 8m)" in html
    assert "target(s)" not in html
    fleet = page(
        "_fleet.html",
        rows=[row],
        counts=counts([row], [row]),
        now=_at(100),
        at=None,
        at_query="",
        **one_page([row]),
    )
    assert "<td>1</td>" in fleet


def test_the_time_control_is_iso_8601_in_utc() -> None:
    html = page(
        "fleet.html",
        rows=[],
        counts=counts([], []),
        filters=Filters(),
        phases=(),
        healths=(),
        providers=(),
        at=_at(5),
        now=_at(10),
        cost=Cost(0, 0.0),
        live_url="",
        at_query="",
        signed_in=False,
        **one_page([]),
    )
    assert 'name="at" value="2026-03-01T12:00:05"' in html
    assert "datetime-local" not in html
