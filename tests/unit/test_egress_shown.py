"""What the API, the console, the CLI and the metrics say of a proxy's egress: one judgement
(``pure.egress_shown``, over ``projections.egress``), the filters on it, and the fleet's counts
of it (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

import msgspec
import pytest

from events.egress import EgressChanged, EgressObserved
from projections.egress import MISMATCH, SHARED, UNCHECKED, EgressPolicy
from services.discovery.http.errors import InvalidRequest
from services.discovery.http.queries import parse_proxy_filter
from services.discovery.pure.egress_shown import (
    asn_filter,
    country_filter,
    index_of,
    shown,
    shown_in,
)
from services.discovery.pure.fleet import count_egress, count_fleet
from tests.support.egress_views import T0, ready, seen, spec

NO_POLICY = EgressPolicy()


def test_a_matching_finding_is_shown_and_holds_nothing_back() -> None:
    view = ready("a", seen("203.0.113.5"), proxy_spec=spec("de"))
    found = shown(view, NO_POLICY)
    assert found is not None
    assert (found.ip, found.country, found.asn_text, found.org) == (
        "203.0.113.5",
        "DE",
        "AS3320",
        "Deutsche Telekom AG",
    )
    assert (found.not_leasable_because, found.flag, found.seen, found.place) == (
        "",
        "",
        "",
        "DE/AS3320",
    )
    # Nothing found and nothing held against it: nothing to show.
    assert shown(ready("b"), NO_POLICY) is None


def test_a_mismatch_says_what_was_seen_and_what_was_expected() -> None:
    view = ready("a", seen("198.51.100.7", country="US", asn=7922), proxy_spec=spec("de"))
    found = shown(view, NO_POLICY)
    assert found is not None
    assert (found.not_leasable_because, found.flag) == (MISMATCH, "mismatch")
    assert "country US, expected DE (spec.egress.expect.country)" in found.seen
    # The proxy's own attribute counts only when the operator names it.
    by_attribute = ready("b", seen("198.51.100.7", country="US"), proxy_spec=spec(cc="de"))
    unnamed = shown(by_attribute, NO_POLICY)
    named = shown(by_attribute, EgressPolicy(country_attribute="cc"))
    assert unnamed is not None
    assert named is not None
    assert (unnamed.not_leasable_because, named.not_leasable_because) == ("", MISMATCH)
    assert "expected DE (spec.attributes.cc)" in named.seen


def test_unchecked_is_shown_without_a_finding_when_it_holds_the_proxy_back() -> None:
    required = EgressPolicy(required=True)
    found = shown(ready("a"), required)
    assert found is not None
    assert (found.ip, found.not_leasable_because, found.flag) == ("", UNCHECKED, "unchecked")
    assert "no check has finished yet" in found.seen
    failed = shown(ready("b", EgressObserved(provider_id="i-1", error="HTTP 404")), required)
    assert failed is not None
    assert (failed.error, failed.not_leasable_because) == ("HTTP 404", UNCHECKED)


def test_a_shared_address_is_flagged_on_both_and_held_back_under_unique_egress() -> None:
    first = ready("a", seen("203.0.113.5"))
    second = ready("b", seen("203.0.113.5"), seq=10)
    alone = ready("c", seen("198.51.100.1"))
    index = index_of([first, second, alone])
    a, b = shown_in(first, NO_POLICY, index), shown_in(second, NO_POLICY, index)
    assert a is not None
    assert b is not None
    assert (a.shared, b.shared) == (("b",), ("a",))
    assert (a.flag, b.flag) == ("shared", "shared")
    assert (a.not_leasable_because, b.not_leasable_because) == ("", "")
    assert "shared with 1 other proxy(ies): b" in a.seen
    unique = EgressPolicy(unique=True)
    a, b = shown_in(first, unique, index), shown_in(second, unique, index)
    assert a is not None
    assert b is not None
    assert (a.not_leasable_because, b.not_leasable_because) == ("", SHARED)
    assert shown_in(alone, unique, index).flag == ""  # type: ignore[union-attr]


def test_a_change_of_address_and_a_failed_check_are_shown() -> None:
    changed = EgressChanged(
        provider_id="i-1",
        ip="198.51.100.9",
        scope="public",
        country="DE",
        asn=3320,
        old_ip="203.0.113.5",
        checked_at=T0,
    )
    view = ready("a", seen("203.0.113.5"), changed)
    found = shown(view, NO_POLICY)
    assert found is not None
    assert (found.ip, found.changed_from, found.checked_at) == ("198.51.100.9", "203.0.113.5", T0)
    failing = ready("b", seen("203.0.113.5"), EgressObserved(provider_id="i-1", error="timeout"))
    after = shown(failing, NO_POLICY)
    assert after is not None
    assert (after.ip, after.error) == ("203.0.113.5", "timeout")


def test_the_api_object_carries_every_field_in_camel_case() -> None:
    first = ready("a", seen("198.51.100.7", country="US"), proxy_spec=spec("de"))
    second = ready("b", seen("198.51.100.7", country="US"), seq=10)
    out = shown_in(first, NO_POLICY, index_of([first, second]))
    body = msgspec.json.decode(msgspec.json.encode(out))
    assert set(body) == {
        "ip",
        "scope",
        "country",
        "asn",
        "org",
        "checkedAt",
        "db",
        "error",
        "changedFrom",
        "shared",
        "notLeasableBecause",
        "seen",
    }
    assert (body["asn"], body["shared"], body["notLeasableBecause"]) == (
        3320,
        ["b"],
        MISMATCH,
    )


def test_filters_take_any_case_and_refuse_what_names_no_country_or_network() -> None:
    assert country_filter(" de ", "f") == "DE"
    assert country_filter("Unknown", "f") == "unknown"
    assert country_filter("", "f") == ""
    assert asn_filter("as3320", "f") == asn_filter("3320", "f") == "AS3320"
    for bad in ("DEU", "d1", "<b>"):
        with pytest.raises(ValueError, match=r"f: .* is not a country"):
            country_filter(bad, "f")
    for bad in ("AS", "AS0", "ASX", "33 20"):
        with pytest.raises(ValueError, match=r"f: .* is not an autonomous system"):
            asn_filter(bad, "f")
    wanted = parse_proxy_filter([("egress.country", "de"), ("egress.asn", "3320")])
    assert wanted.attributes == (("egress.country", "DE"), ("egress.asn", "AS3320"))
    german = ready("a", seen("203.0.113.5"))
    american = ready("b", seen("198.51.100.7", country="US", asn=7922))
    unchecked = ready("c")
    assert [v.uid for v in (german, american, unchecked) if wanted.matches(v)] == ["a"]
    by_attr = parse_proxy_filter([("attr.egress.asn", "AS7922")])
    assert [v.uid for v in (german, american, unchecked) if by_attr.matches(v)] == ["b"]
    for query, named in (
        ([("egress.country", "Germany")], "egress.country:"),
        ([("egress.country", "unknown")], "egress.country:"),
        ([("egress.asn", "telekom")], "egress.asn:"),
        ([("egress.city", "Berlin")], "egress.country=<country>"),
    ):
        with pytest.raises(InvalidRequest, match=named):
            parse_proxy_filter(query)


def test_the_fleet_counts_mismatches_shared_addresses_and_countries() -> None:
    proxies = [
        ready("de-ok", seen("203.0.113.5"), proxy_spec=spec("de")),
        ready("de-bad", seen("198.51.100.7", country="US", asn=7922), proxy_spec=spec("de")),
        ready("twin", seen("203.0.113.5"), seq=20),
        ready("gcp-new", proxy_spec=spec(provider="gcp")),
        ready("private", seen("10.1.2.3", country="", asn=0, scope="private"), seq=40),
    ]
    index = index_of(proxies)
    counts = count_egress(proxies, NO_POLICY, index)
    assert counts.by_provider == {
        "local": {"egress_mismatch": 1, "egress_shared": 2},
        "gcp": {"egress_mismatch": 0, "egress_shared": 0},
    }
    assert counts.countries == {
        ("DE", "local"): 2,
        ("US", "local"): 1,
        ("unknown", "gcp"): 1,
        ("unknown", "local"): 1,
    }
    assert counts.held_back == {"de-bad"}
    # A proxy held back for its egress is not one a lease request would get.
    fleet = count_fleet(proxies, {}, T0, counts.held_back)
    assert fleet.by_provider["local"]["healthy"] == 4
    assert fleet.by_provider["local"]["available"] == 3
    strict = count_egress(proxies, EgressPolicy(required=True, unique=True), index)
    assert strict.held_back == {"de-bad", "twin", "gcp-new"}


def test_a_failed_check_keeps_the_mismatch_of_the_address_before_it() -> None:
    failing = EgressObserved(provider_id="i-1", error="timeout")
    view = ready("a", seen("198.51.100.7", country="US"), failing, proxy_spec=spec("de"))
    found = shown(view, NO_POLICY)
    assert found is not None
    assert found.not_leasable_because == MISMATCH
