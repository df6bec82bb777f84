"""The console's egress: the fleet's Egress and Country/AS columns with their flags, the filter
by egress country, the proxy page's finding, the timeline's lines, all escaped
(docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from markupsafe import escape

from events.egress import EgressChanged, EgressObserved
from events.schemas import RotationRequested
from events.store import Recorded
from projections.egress import EgressPolicy
from projections.proxy import ProxyView
from services.discovery.console.history import Cost
from services.discovery.console.pure.fleet import (
    FilterError,
    Filters,
    Row,
    counts,
    parse_filters,
    row,
    rows,
)
from services.discovery.console.pure.fleet_page import one_page
from services.discovery.console.pure.timeline import line
from services.discovery.console.render import page
from services.discovery.pure.egress_shown import shown
from tests.support.egress_views import T0, ready, seen, spec

HOSTILE = '<img src=x onerror="alert(1)">&amp;'
NOW = T0 + timedelta(hours=1)


def fleet() -> list[ProxyView]:
    return [
        ready("de-ok", seen("203.0.113.5"), proxy_spec=spec("de")),
        ready("de-bad", seen("198.51.100.7", country="US", asn=7922), proxy_spec=spec("de")),
        ready("twin", seen("203.0.113.5"), seq=20),
        ready("new"),
    ]


def fleet_html(every: list[Row], filters: Filters) -> str:
    shown_rows = [r for r in every if filters.matches(r)]
    return page(
        "fleet.html",
        rows=shown_rows,
        counts=counts(shown_rows, every),
        filters=filters,
        phases=("Ready",),
        healths=("healthy",),
        providers=("local",),
        at=None,
        now=NOW,
        cost=Cost(0, 0.0),
        live_url="/ui/live",
        at_query="",
        signed_in=False,
        **one_page(shown_rows),
    )


def test_rows_carry_the_egress_and_a_mismatch_is_not_available() -> None:
    every = rows(fleet(), {}, NOW)
    by_uid = {r.uid: r for r in every}
    assert by_uid["de-bad"].egress is not None
    assert by_uid["de-bad"].egress.flag == "mismatch"
    assert not by_uid["de-bad"].available
    assert by_uid["de-ok"].available
    assert by_uid["de-ok"].egress.shared == ("twin",)  # type: ignore[union-attr]
    assert by_uid["new"].egress is None
    assert by_uid["new"].egress_country == "unknown"
    summary = counts(every, every)
    assert summary.egress_flagged == 3  # the mismatch, and both proxies on one address
    assert summary.egress_countries == ("DE", "US", "unknown")
    # Under --unique-egress the later proxy on the address is held back too.
    strict = {r.uid: r for r in rows(fleet(), {}, NOW, policy=EgressPolicy(unique=True))}
    assert (strict["de-ok"].available, strict["twin"].available) == (True, False)


def test_the_egress_country_filter_parses_matches_and_round_trips() -> None:
    every = rows(fleet(), {}, NOW)
    wanted = parse_filters([("egress_country", "us")])
    assert wanted == Filters(egress_country="US")
    assert [r.uid for r in every if wanted.matches(r)] == ["de-bad"]
    assert parse_filters(wanted.query()) == wanted
    unknown = parse_filters([("egress_country", "unknown")])
    assert [r.uid for r in every if unknown.matches(r)] == ["new"]
    assert parse_filters([("egress_country", "")]) == Filters()
    with pytest.raises(FilterError, match="egress_country: 'Germany' is not a country"):
        parse_filters([("egress_country", "Germany")])
    html = fleet_html(every, wanted)
    assert 'data-uid="de-bad"' in html
    assert 'data-uid="de-ok"' not in html
    assert '<option value="US" selected>US</option>' in html
    assert '<option value="unknown">unknown</option>' in html


def test_the_fleet_page_shows_egress_columns_and_flags_with_their_reason() -> None:
    html = fleet_html(rows(fleet(), {}, NOW), Filters())
    assert "<th>Egress</th><th>Country/AS</th>" in html
    assert "US / AS7922" in html
    assert ">mismatch</span>" in html
    assert ">shared</span>" in html
    assert "country US, expected DE (spec.egress.expect.country)" in html
    assert "shared with 1 other proxy(ies): twin" in html
    assert 'data-count="egress-flagged">3<' in html


def test_the_proxy_page_shows_the_finding_and_the_replacements() -> None:
    changed = EgressChanged(
        provider_id="i-1",
        ip="198.51.100.9",
        scope="public",
        country="US",
        asn=7922,
        org="Comcast",
        db="GeoLite2-ASN 2026-11-28",
        old_ip="203.0.113.5",
        checked_at=T0 + timedelta(minutes=30),
    )
    failed = EgressObserved(provider_id="i-1", error="no answer within 10 s")
    asked = RotationRequested(uid="p", rotation_id="r1", reason="EgressMismatch")
    proxy = ready("p", seen("203.0.113.5"), changed, failed, asked, proxy_spec=spec("de"))
    html = proxy_html(proxy)
    for text in (
        "198.51.100.9",
        "US · AS7922 Comcast",
        "placed by GeoLite2-ASN 2026-11-28",
        "checked 2026-12-01 12:30:00 (30m ago)",
        "changed from 203.0.113.5",
        "last check failed: no answer within 10 s",
        'data-col="egress-replacements">1 ',
    ):
        assert text in html, text
    mismatched = proxy_html(ready("p", seen("198.51.100.9", country="US"), proxy_spec=spec("de")))
    assert ">mismatch</span>" in mismatched
    assert "country US, expected DE (spec.egress.expect.country)" in mismatched
    assert "not checked yet" in proxy_html(ready("q"))


def proxy_html(proxy: ProxyView) -> str:
    return page(
        "_proxy.html",
        proxy=proxy,
        row=row(proxy, None, NOW, egress=shown(proxy, EgressPolicy())),
        lines=[],
        left_out=0,
        at=None,
        now=NOW,
        at_query="",
    )


def test_the_timeline_summarises_egress_findings() -> None:
    def summary_of(event: EgressObserved) -> str:
        return line(Recorded(event, 9, "proxy.p.egress", T0), "PROXY").summary

    assert summary_of(seen("203.0.113.5")) == (
        "egress 203.0.113.5 (DE, AS3320, Deutsche Telekom AG) (i-1)"
    )
    assert summary_of(EgressObserved(provider_id="i-1", error="HTTP 404")) == (
        "egress check failed (i-1): HTTP 404"
    )
    moved = EgressChanged(provider_id="i-1", ip="198.51.100.9", country="US", old_ip="203.0.113.5")
    assert summary_of(moved) == "egress changed from 203.0.113.5 to 198.51.100.9 (US)"
    assert line(Recorded(moved, 9, "proxy.p.egress", T0), "PROXY").kind == "egress"


def test_hostile_findings_are_escaped_on_both_pages() -> None:
    hostile = seen(
        "198.51.100.7",
        country="US",
        org=HOSTILE,
        db=HOSTILE,
        error=HOSTILE,
    )
    moved = EgressChanged(
        provider_id="i-1", ip=HOSTILE, country="US", org=HOSTILE, old_ip=HOSTILE, error=HOSTILE
    )
    for proxy in (
        ready("p", hostile, proxy_spec=spec("de")),
        ready("p", moved, proxy_spec=spec("de")),
    ):
        every = rows([proxy, ready("q", moved, seq=20)], {}, NOW)
        for html in (fleet_html(every, Filters()), proxy_html(proxy)):
            assert HOSTILE not in html
            assert "<img" not in html
            assert str(escape(HOSTILE)) in html
