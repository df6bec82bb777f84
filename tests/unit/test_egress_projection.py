"""The egress part of the proxy fold and the pure judgement of a finding
(projections/egress.py, docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from events.egress import EGRESS_MISMATCH, EgressChanged, EgressObserved
from events.schemas import (
    Event,
    InstanceCreated,
    ProxyDeclared,
    ProxySpec,
    ProxySpecChanged,
    RotationRequested,
)
from events.spec import Egress, EgressExpect
from events.store import Recorded
from projections import egress
from projections.egress import MISMATCH, SHARED, UNCHECKED, EgressIndex, EgressPolicy
from projections.proxy import ProxyView, apply

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def fold(*events: Event, spec: ProxySpec | None = None, uid: str = "p1") -> ProxyView:
    declared = ProxyDeclared(uid=uid, namespace="crawl", name=uid, spec=spec or ProxySpec())
    view: ProxyView | None = None
    for seq, event in enumerate((declared, *events), start=1):
        at = T0 + timedelta(seconds=seq)
        view = apply(view, Recorded(event, seq, f"proxy.{uid}.{event.category}", at))  # type: ignore[arg-type]
    assert view is not None
    return view


def seen(
    ip: str, country: str = "DE", asn: int = 3320, pid: str = "i-1", **kw: object
) -> EgressObserved:
    return EgressObserved(provider_id=pid, ip=ip, scope="public", country=country, asn=asn, **kw)  # type: ignore[arg-type]


def expecting(country: str = "", asn: tuple[int, ...] = (), **attributes: str) -> ProxySpec:
    return ProxySpec(
        provider="local",
        attributes=attributes,
        egress=Egress(expect=EgressExpect(country=country, asn=asn)),
    )


def test_a_finding_belongs_to_the_instance_it_was_made_through() -> None:
    view = fold(
        InstanceCreated(command_id="c", provider="local", provider_id="i-1"), seen("203.0.113.5")
    )
    found = egress.finding(view)
    assert found is not None
    assert (found.ip, found.country, found.asn) == ("203.0.113.5", "DE", 3320)
    # A replacement's finding is kept beside it, and is not the proxy's until it takes over.
    view = fold(
        InstanceCreated(command_id="c", provider="local", provider_id="i-1"),
        seen("203.0.113.5"),
        seen("198.51.100.7", country="US", pid="i-2"),
    )
    assert egress.finding(view) is not None
    assert egress.finding(view).ip == "203.0.113.5"  # type: ignore[union-attr]
    assert egress.finding(view, "i-2").ip == "198.51.100.7"  # type: ignore[union-attr]


def test_at_most_two_findings_are_kept() -> None:
    events = [seen(f"203.0.113.{n}", pid=f"i-{n}") for n in range(1, 6)]
    view = fold(*events)
    assert [e.provider_id for e in view.egress] == ["i-4", "i-5"]


def test_a_failed_check_after_a_good_one_keeps_the_address_with_the_error() -> None:
    failed = EgressObserved(provider_id="i-1", error="no answer within 10s")
    view = fold(
        InstanceCreated(command_id="c", provider="local", provider_id="i-1"),
        seen("203.0.113.5"),
        failed,
    )
    found = egress.finding(view)
    assert found is not None
    assert found.ip == "203.0.113.5"
    assert found.error == "no answer within 10s"


def test_a_change_records_the_old_address() -> None:
    changed = EgressChanged(
        provider_id="i-1", ip="198.51.100.9", country="US", old_ip="203.0.113.5"
    )
    view = fold(
        InstanceCreated(command_id="c", provider="local", provider_id="i-1"),
        seen("203.0.113.5"),
        changed,
    )
    found = egress.finding(view)
    assert found is not None
    assert (found.ip, found.changed_from) == ("198.51.100.9", "203.0.113.5")


def created() -> InstanceCreated:
    return InstanceCreated(command_id="c", provider="local", provider_id="i-1")


def test_mismatch_by_country_asn_and_the_country_attribute() -> None:
    policy = EgressPolicy()
    german = fold(created(), seen("203.0.113.5", country="DE"), spec=expecting("de"))
    american = fold(created(), seen("198.51.100.7", country="US"), spec=expecting("de"))
    assert egress.mismatch(german, egress.finding(german), policy) == ""
    assert "country US, expected DE (spec.egress.expect.country)" in egress.mismatch(
        american, egress.finding(american), policy
    )
    wrong_as = fold(created(), seen("203.0.113.5", asn=3209), spec=expecting(asn=(3320,)))
    assert "AS3209, expected one of AS3320" in egress.mismatch(
        wrong_as, egress.finding(wrong_as), policy
    )
    unknown_as = fold(created(), seen("203.0.113.5", asn=0), spec=expecting(asn=(3320,)))
    assert "give --geoip-db an ASN database" in egress.mismatch(
        unknown_as, egress.finding(unknown_as), policy
    )
    # The proxy's own attribute, when the operator names it; the spec's expectation wins.
    by_attribute = fold(created(), seen("198.51.100.7", country="US"), spec=expecting(country="de"))
    assert egress.mismatch(
        by_attribute, egress.finding(by_attribute), EgressPolicy(country_attribute="country")
    )
    attr_only = fold(created(), seen("198.51.100.7", country="US"), spec=expecting(country=""))
    attr_only = msgspec.structs.replace(
        attr_only, spec=ProxySpec(provider="local", attributes={"country": "de"})
    )
    assert egress.mismatch(attr_only, egress.finding(attr_only), policy) == ""
    told = egress.mismatch(
        attr_only, egress.finding(attr_only), EgressPolicy(country_attribute="country")
    )
    assert "expected DE (spec.attributes.country)" in told


def test_blocked_reasons() -> None:
    plain = fold(created())
    assert egress.blocked(plain, EgressPolicy()) == ("", "")
    assert egress.blocked(plain, EgressPolicy(required=True))[0] == UNCHECKED
    # An expectation cannot be kept unseen.
    assert egress.blocked(fold(created(), spec=expecting("de")), EgressPolicy())[0] == UNCHECKED
    failing = fold(
        created(), EgressObserved(provider_id="i-1", error="HTTP 404"), spec=expecting("de")
    )
    reason, told = egress.blocked(failing, EgressPolicy())
    assert reason == UNCHECKED
    assert "HTTP 404" in told
    american = fold(created(), seen("198.51.100.7", country="US"), spec=expecting("de"))
    assert egress.blocked(american, EgressPolicy())[0] == MISMATCH
    shared = fold(created(), seen("203.0.113.5"))
    assert egress.blocked(shared, EgressPolicy(), shared_later=True) == ("", "")
    assert egress.blocked(shared, EgressPolicy(unique=True), shared_later=True)[0] == SHARED


def test_egress_rotations_are_counted_until_the_spec_changes() -> None:
    asked = RotationRequested(uid="p1", rotation_id="r1", reason=EGRESS_MISMATCH)
    by_holder = RotationRequested(uid="p1", rotation_id="r2")
    view = fold(created(), asked, by_holder)
    assert view.egress_replacements == 1
    changed = ProxySpecChanged(uid="p1", spec=expecting("us"), generation=2)
    assert fold(created(), asked, changed).egress_replacements == 0


def test_the_index_flags_a_shared_address_and_the_later_proxy() -> None:
    index = EgressIndex()
    first = fold(created(), seen("203.0.113.5"), uid="a")
    second = fold(created(), seen("203.0.113.5"), uid="b")
    second = msgspec.structs.replace(
        second, egress=(msgspec.structs.replace(second.egress[0], seq=99),)
    )
    assert index.put("a", first) == {"a"}
    assert index.put("b", second) == {"a", "b"}
    assert index.sharing("a") == ["b"]
    assert index.shared() == {"203.0.113.5": ["a", "b"]}
    assert not index.later("a")
    assert index.later("b")
    # The first one leaves the address: the clash ends, and both are touched.
    moved = fold(created(), seen("198.51.100.1"), uid="a")
    assert index.put("a", moved) == {"a", "b"}
    assert not index.later("b")
    assert index.shared() == {}
    # Private addresses (an echo inside the proxy's network) are never a clash.
    private = fold(created(), seen("127.0.0.1", country=""), uid="c")
    private = msgspec.structs.replace(
        private, egress=(msgspec.structs.replace(private.egress[0], scope="private"),)
    )
    index.put("c", private)
    index.put("d", msgspec.structs.replace(private, uid="d"))
    assert index.sharing("c") == []
    index.put("b", None)
    assert index.by_ip == {"198.51.100.1": {"a": moved.egress[0].seq}}


hostile_text = st.text(max_size=300)


@given(
    pid=hostile_text,
    ip=hostile_text,
    country=hostile_text,
    asn=st.integers(min_value=-(2**63), max_value=2**64 - 1),
    error=hostile_text,
    old=hostile_text,
    expect_country=st.sampled_from(["", "de", "US"]),
)
def test_any_finding_in_the_log_folds_and_is_judged_without_a_crash(  # noqa: PLR0917 - hypothesis passes each drawn value by name
    pid: str, ip: str, country: str, asn: int, error: str, old: str, expect_country: str
) -> None:
    """Only the health service may write ``egress``, but the log is for ever: whatever a
    finding holds, the fold and every judgement of it answer."""
    events: list[Event] = [
        InstanceCreated(command_id="c", provider="local", provider_id=pid or "i"),
        EgressObserved(provider_id=pid, ip=ip, country=country, asn=asn, error=error),
        EgressChanged(provider_id=pid, ip=old, old_ip=ip, country=country, asn=asn),
    ]
    view = fold(*events, spec=expecting(expect_country))
    for policy in (EgressPolicy(), EgressPolicy(country_attribute="c", required=True, unique=True)):
        egress.blocked(view, policy, shared_later=True)
        egress.mismatch(view, egress.finding(view), policy)
    index = EgressIndex()
    index.put(view.uid, view)
    index.later(view.uid)
    index.put(view.uid, None)
    assert index.by_ip == {}
