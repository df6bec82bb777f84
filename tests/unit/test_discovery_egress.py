"""Discovery judges egress findings: a proxy whose egress does not match is not a candidate and
the 503 says what was seen; the egress seen is selectable; a later proxy on a shared address is
held back only under ``--unique-egress`` (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from events.egress import EgressObserved
from events.schemas import InstanceCreated, ProxySpecChanged
from events.spec import Egress, EgressExpect, ProxySpec
from projections.egress import EgressPolicy
from services.discovery.http.errors import NoProxyAvailable
from services.discovery.leasing.refusals import refusal
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from tests.support.hand_views import Fleet


def fleet(policy: EgressPolicy) -> Fleet:
    return Fleet(Views(None, InMemoryEventStore(), egress=policy))  # type: ignore[arg-type]


def at(uid: str, ip: str, country: str, asn: int = 0) -> tuple[InstanceCreated, EgressObserved]:
    return (
        InstanceCreated(command_id="c", provider="local", provider_id=f"i-{uid}"),
        EgressObserved(
            provider_id=f"i-{uid}", ip=ip, scope="public", country=country, asn=asn, org="Org"
        ),
    )


def expect_de(uid: str) -> ProxySpecChanged:
    spec = ProxySpec(
        attributes={"country": "de"},
        egress=Egress(expect=EgressExpect(country="de")),
    )
    return ProxySpecChanged(uid=uid, spec=spec, generation=2)


def test_a_mismatch_is_not_leased_and_the_refusal_says_what_was_seen() -> None:
    f = fleet(EgressPolicy())
    f.proxy("de-1", {"country": "de"}, expect_de("de-1"), *at("de-1", "198.51.100.7", "US"))
    f.proxy("de-2", {"country": "de"}, expect_de("de-2"), *at("de-2", "203.0.113.5", "DE"))
    assert f.views.candidates.matching({"country": "de"}) == ["de-2"]
    f.proxy("de-2", {"country": "de"}, expect_de("de-2"), *at("de-2", "198.51.100.8", "US"))
    assert f.views.candidates.matching({"country": "de"}) == []
    error = refusal(f.views, {"country": "de"})
    assert isinstance(error, NoProxyAvailable)
    assert "2 egress_mismatch (egress 198.51.100." in error.message
    assert "country US, expected DE (spec.egress.expect.country)" in error.message


def test_the_country_attribute_is_the_expectation_when_the_operator_names_it() -> None:
    plain = fleet(EgressPolicy())
    plain.proxy("de-1", {"country": "de"}, *at("de-1", "198.51.100.7", "US"))
    assert plain.views.candidates.matching({}) == ["de-1"]
    strict = fleet(EgressPolicy(country_attribute="country"))
    strict.proxy("de-1", {"country": "de"}, *at("de-1", "198.51.100.7", "US"))
    strict.proxy("de-2", {"country": "de"}, *at("de-2", "203.0.113.5", "DE"))
    assert strict.views.candidates.matching({}) == ["de-2"]


def test_selectors_on_the_egress_seen() -> None:
    f = fleet(EgressPolicy())
    f.proxy("a", {}, *at("a", "203.0.113.5", "DE", asn=3320))
    f.proxy("b", {}, *at("b", "198.51.100.7", "US", asn=7018))
    f.proxy("c", {})  # not checked: no egress pairs
    assert f.views.candidates.matching({"egress.country": "DE"}) == ["a"]
    assert f.views.candidates.matching({"egress.asn": "AS7018"}) == ["b"]
    # As people write them: a country in lower case, an AS number bare or lower case.
    assert f.views.candidates.matching({"egress.country": "de"}) == ["a"]
    assert f.views.candidates.matching({"egress.asn": "7018"}) == ["b"]
    assert f.views.candidates.matching({"egress.asn": "as3320"}) == ["a"]
    assert f.views.candidates.matching({"egress.country": "FR"}) == []


def test_required_holds_back_a_proxy_until_its_first_check() -> None:
    f = fleet(EgressPolicy(required=True))
    f.proxy("a", {})
    assert f.views.candidates.matching({}) == []
    assert "1 egress_unchecked" in refusal(f.views, {}).message
    f.proxy("a", {}, *at("a", "203.0.113.5", "DE"))
    assert f.views.candidates.matching({}) == ["a"]


def test_unique_egress_holds_back_the_later_proxy_until_the_clash_ends() -> None:
    for policy, later_leasable in ((EgressPolicy(), True), (EgressPolicy(unique=True), False)):
        f = fleet(policy)
        f.proxy("a", {}, *at("a", "203.0.113.5", "DE"))
        f.proxy("b", {}, *at("b", "203.0.113.5", "DE"))
        assert f.views.candidates.egress.shared() == {"203.0.113.5": ["a", "b"]}
        assert ("b" in f.views.candidates.matching({})) is later_leasable
        assert "a" in f.views.candidates.matching({})
        # The first leaves the address: the later one is a candidate again at once.
        f.proxy("a", {}, *at("a", "203.0.113.9", "DE"))
        assert sorted(f.views.candidates.matching({})) == ["a", "b"]
