"""The Proxy resource: unknown fields and bounds, named with the fix."""

from __future__ import annotations

from typing import Any

import pytest

from events.customresource import ResourceError
from events.proxyresource import from_object, unknown_fields


def proxy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "de-1", "namespace": "crawl"},
        "spec": {"provider": "local", **spec},
    }


@pytest.mark.parametrize(
    ("edit", "path", "hint"),
    [
        (
            lambda o: o["spec"].update(atributes={"country": "de"}),
            "spec.atributes",
            "spec.attributes",
        ),
        (lambda o: o["spec"].update(healthChek={}), "spec.healthChek", "spec.healthCheck"),
        (lambda o: o["metadata"].update(bogus=1), "metadata.bogus", "known: annotations"),
        (lambda o: o.update(sepc={}), "sepc", "did you mean spec?"),
        (
            lambda o: o["spec"].update(healthCheck={"intervalSecond": 2}),
            "spec.healthCheck.intervalSecond",
            "spec.healthCheck.intervalSeconds",
        ),
        (
            lambda o: o["spec"].update(cloudInit={"secretRef": {"nam": "s"}}),
            "spec.cloudInit.secretRef.nam",
            "spec.cloudInit.secretRef.name",
        ),
    ],
)
def test_unknown_fields_are_named_with_the_closest_valid_one(
    edit: Any, path: str, hint: str
) -> None:
    obj = proxy()
    edit(obj)
    errors = unknown_fields(obj)
    assert [e.path for e in errors] == [path]
    assert hint in errors[0].message


def test_a_manifest_saved_from_a_cluster_has_no_unknown_fields() -> None:
    obj = proxy(attributes={"any-key": "x"})
    obj["metadata"].update(
        uid="u", resourceVersion="1", creationTimestamp="t", managedFields=[], finalizers=[]
    )
    obj["status"] = {"phase": "Ready"}
    assert unknown_fields(obj) == []


@pytest.mark.parametrize(
    ("check", "field"),
    [
        ({"intervalSeconds": float("inf")}, "spec.healthCheck.intervalSeconds"),
        ({"intervalSeconds": float("nan")}, "spec.healthCheck.intervalSeconds"),
        ({"intervalSeconds": 1e9}, "spec.healthCheck.intervalSeconds"),
        ({"timeoutSeconds": 0}, "spec.healthCheck.timeoutSeconds"),
        ({"timeoutSeconds": 1e300}, "spec.healthCheck.timeoutSeconds"),
        ({"failureThreshold": 10**12}, "spec.healthCheck.failureThreshold"),
        ({"successThreshold": 0}, "spec.healthCheck.successThreshold"),
    ],
)
def test_health_check_values_have_finite_bounds(check: dict[str, Any], field: str) -> None:
    with pytest.raises(ResourceError) as info:
        from_object(proxy(healthCheck=check))
    assert field in str(info.value)


@pytest.mark.parametrize(
    ("egress", "field"),
    [
        ({"egress": {"expect": {"country": "d1"}}}, "spec.egress.expect.country"),
        ({"egress": {"expect": {"country": "deu"}}}, "spec.egress.expect.country"),
        ({"egress": {"expect": {"asn": [0]}}}, "spec.egress.expect.asn[0]"),
        ({"egress": {"expect": {"asn": [3320, -1]}}}, "spec.egress.expect.asn[1]"),
        ({"egress": {"expect": {"asn": [2**32]}}}, "spec.egress.expect.asn[0]"),
        ({"egress": {"expect": {"asn": list(range(1, 40))}}}, "spec.egress.expect.asn"),
        ({"egress": {"expect": {"asn": ["AS3320"]}}}, "spec.egress.expect.asn"),
        ({"egress": {"expect": {"asn": [True]}}}, "spec.egress.expect.asn"),
        ({"egress": {"onMismatch": "explode"}}, "spec.egress.onMismatch"),
        ({"egressCheck": {"url": "ftp://echo/"}}, "spec.egressCheck.url"),
        ({"egressCheck": {"url": "javascript:alert(1)"}}, "spec.egressCheck.url"),
        ({"attributes": {"egress.country": "DE"}}, "spec.attributes.egress.country"),
    ],
)
def test_egress_fields_are_refused_naming_the_field(egress: dict[str, Any], field: str) -> None:
    """What a Proxy expects of its egress goes into the log: no coercion, finite bounds, and
    no attribute that would pass for what was seen (docs/decisions/0111-verified-egress.md)."""
    with pytest.raises(ResourceError) as info:
        from_object(proxy(**egress))
    assert field in str(info.value)


def test_a_misspelt_egress_field_is_named() -> None:
    found = unknown_fields(proxy(egress={"expect": {"contry": "de"}}))
    assert [f.path for f in found] == ["spec.egress.expect.contry"]


def test_a_valid_egress_expectation_is_kept() -> None:
    declared = from_object(
        proxy(
            egress={"expect": {"country": "de", "asn": [3320, 3209]}, "onMismatch": "replace"},
            egressCheck={"url": "https://echo.example/ip"},
        )
    )
    rules = declared.spec.egress_rules
    assert (rules.expect.country, rules.expect.asn, rules.on_mismatch) == (
        "de",
        (3320, 3209),
        "replace",
    )
    assert declared.spec.egress_url == "https://echo.example/ip"
