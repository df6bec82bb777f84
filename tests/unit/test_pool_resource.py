"""The ProxyPool resource (``events.poolresource``): every field's bounds, named with the fix, and
whatever a manifest holds refused as a ``ResourceError``; the member names it derives."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.customresource import API_VERSION, ResourceError
from events.pool import MAX_AGE_SECONDS, Autoscale, PoolSpec, SpreadEntry
from events.poolresource import (
    MAX_POOL_NAME,
    member_name,
    pool_uid,
    unknown_pool_fields,
)
from events.poolresource import from_object as pool_from_object
from events.proxyresource import from_object as proxy_from_object
from projections.pool import usable_spec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def pool(metadata: dict[str, Any] | None = None, /, **spec: Any) -> dict[str, Any]:
    """A ProxyPool manifest; with a spread (and no template given) the template names no
    provider, as the spread's rule wants."""
    template = {} if "spread" in spec else {"provider": "local"}
    body: dict[str, Any] = {"replicas": 3, "template": template}
    body.update(spec)
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "de", "namespace": "crawl", **(metadata or {})},
        "spec": body,
    }


def accepted(obj: Any) -> PoolSpec:
    _, spec = pool_from_object(obj)
    assert usable_spec(spec), spec  # what the fold would take as it is
    return spec


def refused(obj: Any) -> ResourceError:
    with pytest.raises(ResourceError) as info:
        pool_from_object(obj)
    return info.value


def test_a_pool_gives_the_spec_the_log_keeps() -> None:
    spec = accepted(
        pool(
            replicas=20,
            template={"attributes": {"country": "de"}, "placement": {"zone": "b"}},
            spread=[{"provider": "a", "weight": 2}, {"provider": "b"}],
            maxAge="6h",
            recycleOnBlocks=3,
            maxSurge=2,
        )
    )
    assert spec.replicas == 20
    assert spec.spread == (SpreadEntry(provider="a", weight=2), SpreadEntry(provider="b"))
    assert spec.template.provider == ""  # the spread names them
    assert spec.template.attributes == {"country": "de"}
    assert (spec.max_age_seconds, spec.recycle_on_blocks, spec.max_surge) == (21600.0, 3, 2)


def test_defaults() -> None:
    spec = accepted(pool(replicas=0))
    assert (spec.replicas, spec.max_age_seconds, spec.recycle_on_blocks, spec.max_surge) == (
        0,
        0.0,
        0,
        1,
    )


# ------------------------------------------------------------------------------ the bounds


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("replicas", 0, True),
        ("replicas", 10_000, True),
        ("replicas", -1, False),
        ("replicas", 10_001, False),
        ("replicas", 10**30, False),
        ("maxSurge", 1, True),
        ("maxSurge", 100, True),
        ("maxSurge", 0, False),
        ("maxSurge", 101, False),
        ("recycleOnBlocks", 0, True),
        ("recycleOnBlocks", 1000, True),
        ("recycleOnBlocks", -1, False),
        ("recycleOnBlocks", 1001, False),
    ],
)
def test_counts_have_bounds_named_in_the_error(field: str, value: int, ok: bool) -> None:
    obj = pool(**{field: value})
    if ok:
        accepted(obj)
        return
    error = refused(obj)
    assert [e.path for e in error.errors] == [f"spec.{field}"]
    low, high = {"replicas": (0, 10_000), "maxSurge": (1, 100), "recycleOnBlocks": (0, 1000)}[field]
    assert error.errors[0].message == f"must be from {low} to {high}"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("6h", 21600.0),
        ("90", 90.0),
        (30, 30.0),
        (30.5, 30.5),
        ("1h30m", 5400.0),
        ("0", 0.0),
        (0, 0.0),
        ("10s", 10.0),
        ("8760h", MAX_AGE_SECONDS),
    ],
)
def test_max_age_is_read_as_people_write_it(value: Any, seconds: float) -> None:
    assert accepted(pool(maxAge=value)).max_age_seconds == seconds


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("6x", "is not a duration; use e.g. 30s"),
        ("-1s", "is not a duration; use e.g. 30s"),
        ("inf", "is not a duration; use e.g. 30s"),
        ("nan", "is not a duration; use e.g. 30s"),
        ("", "an empty duration; use e.g. 30s"),
        (1e400, "is not a duration; use e.g. 30s"),
        (math.nan, "is not a duration; use e.g. 30s"),
        (-5, "is not a duration; use e.g. 30s"),
        ("9s", "0 (never), or from 10s to 8760h"),
        ("8761h", "0 (never), or from 10s to 8760h"),
        (10**30, "0 (never), or from 10s to 8760h"),
        (10**400, "out of range"),
        (True, "got `bool`"),
        ([6], "got `array`"),
        ({"hours": 6}, "got `object`"),
    ],
)
def test_a_bad_max_age_names_the_field_and_the_forms(value: Any, hint: str) -> None:
    error = refused(pool(maxAge=value))
    assert len(error.errors) == 1
    assert error.errors[0].path.removeprefix("$.") == "spec.maxAge"
    assert hint in error.errors[0].message


@pytest.mark.parametrize(
    ("spec", "path", "hint"),
    [
        ({"spread": [{"provider": "a", "weight": 0}]}, "spec.spread[0].weight", "from 1 to 1000"),
        ({"spread": [{"provider": "a", "weight": 1001}]}, "spec.spread[0].weight", "1 to 1000"),
        ({"spread": [{"provider": "a", "weight": -2}]}, "spec.spread[0].weight", "1 to 1000"),
        ({"spread": [{"provider": "a"}, {"provider": "a"}]}, "spec.spread[1].provider", "twice"),
        ({"spread": [{"provider": "no such"}]}, "spec.spread[0].provider", "e.g. local"),
        ({"spread": [{"provider": ""}]}, "spec.spread[0].provider", "provider instance"),
        (
            {"spread": [{"provider": f"p{i}"} for i in range(17)]},
            "spec.spread",
            "at most 16 entries",
        ),
        (
            {"template": {"provider": "local"}, "spread": [{"provider": "a"}]},
            "spec.template.provider",
            "the spread names the providers; remove it or the spread",
        ),
        ({"template": {}}, "spec.template.provider", "required for mode Managed"),
        (
            {"template": {"provider": "local", "attributes": {"pool": "x"}}},
            "spec.template.attributes.pool",
            "set by the pool on every member (its name); remove it",
        ),
        (
            {"template": {"provider": "local", "cloudInit": {"secretRef": {"name": "s"}}}},
            "spec.template.cloudInit.secretRef",
            "spec.template.cloudInit.inline",
        ),
        (
            {"template": {"provider": "local", "healthCheck": {"intervalSeconds": 0}}},
            "spec.template.healthCheck.intervalSeconds",
            "more than 0",
        ),
    ],
)
def test_a_bad_spread_or_template_names_the_field_and_the_fix(
    spec: dict[str, Any], path: str, hint: str
) -> None:
    """Exactly that field: a spread entry's own mistake is not also blamed on the template."""
    error = refused(pool(**spec))
    assert [e.path for e in error.errors] == [path], error
    assert hint in error.errors[0].message


def test_a_pool_of_external_proxies_is_refused() -> None:
    """Its members would have no provider to run on: planned, refused by the fold, planned
    again at every evaluation."""
    error = refused(
        pool(template={"mode": "External", "external": {"url": "http://10.0.0.5:3128"}})
    )
    paths = [e.path for e in error.errors]
    assert paths[0] == "spec.template.mode"
    assert "Managed" in error.errors[0].message
    assert "spec.template.external.url" in paths


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ({"name": "a" * MAX_POOL_NAME}, True),
        ({"name": "a" * (MAX_POOL_NAME + 1)}, False),
        ({"name": "De"}, False),
        ({"name": ""}, False),
        ({"name": "de-"}, False),
        ({"namespace": "Crawl"}, False),
    ],
)
def test_the_pools_name_leaves_room_for_its_members(metadata: dict[str, Any], ok: bool) -> None:
    if ok:
        accepted(pool(metadata))
        return
    error = refused(pool(metadata))
    (field,) = metadata
    assert [e.path for e in error.errors] == [f"metadata.{field}"]
    if field == "name":
        assert "1-57 lowercase letters" in error.errors[0].message


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({**pool(), "kind": "Proxy"}, "kind"),
        ({**pool(), "apiVersion": "v1"}, "apiVersion"),
    ],
)
def test_kind_and_api_version(obj: dict[str, Any], path: str) -> None:
    assert [e.path for e in refused(obj).errors] == [path]


# ------------------------------------------------------------------------- unknown fields


@pytest.mark.parametrize(
    ("spec", "path", "hint"),
    [
        ({"replica": 3}, "spec.replica", "spec.replicas"),
        ({"maxage": "6h"}, "spec.maxage", "spec.maxAge"),
        ({"template": {"provder": "x"}}, "spec.template.provder", "spec.template.provider"),
        (
            {"spread": [{"provider": "a", "wieght": 2}]},
            "spec.spread[0].wieght",
            "spec.spread[0].weight",
        ),
        ({"autoscale": {"mni": 1}}, "spec.autoscale.mni", "spec.autoscale.min"),
        ({"autoscale": {"scaleUpAfterr": "1m"}}, "spec.autoscale.scaleUpAfterr", "scaleUpAfter"),
    ],
)
def test_unknown_fields_are_named_with_the_closest_valid_one(
    spec: dict[str, Any], path: str, hint: str
) -> None:
    errors = unknown_pool_fields(pool(**spec))
    assert [e.path for e in errors] == [path]
    assert hint in errors[0].message


def test_a_pool_as_written_has_no_unknown_fields() -> None:
    obj = pool(spread=[{"provider": "a", "weight": 2}], maxAge="6h", maxSurge=2)
    obj["status"] = {"replicas": 3}
    assert unknown_pool_fields(obj) == []
    assert unknown_pool_fields([obj]) == []


# ------------------------------------------------------------------------ hostile objects


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ([], "$"),
        ([pool()], "$"),
        (None, "$"),
        ("ProxyPool", "$"),
        (3, "$"),
        ({1: 2}, "$"),
        ({"spec": []}, "$.spec"),
        ({"spec": {"template": {"attributes": {"a": 1}}}}, "$.spec.template.attributes[...]"),
        ({"spec": {"template": {"attributes": {1: "a"}}}}, "$.spec.template.attributes"),
        ({"spec": {"spread": {"a": 1}}}, "$.spec.spread"),
        ({"spec": {"spread": [{"weight": 2}]}}, "$.spec.spread[0]"),
        ({"spec": {"template": {"placement": [[[]]]}}}, "$.spec.template.placement"),
        ({"metadata": None}, "$.metadata"),
    ],
)
def test_whatever_is_not_a_pool_is_a_resource_error_naming_where(obj: Any, path: str) -> None:
    error = refused(obj)
    assert [e.path for e in error.errors] == [path]
    assert "`" not in error.errors[0].path


def test_huge_strings_are_refused_quickly_and_named() -> None:
    huge = "a" * 1_000_000
    for obj, path in [
        (pool({"name": huge}), "metadata.name"),
        (pool(maxAge=huge), "spec.maxAge"),
        (pool(maxAge="9" * 100_000), "spec.maxAge"),
        (pool(spread=[{"provider": huge}]), "spec.spread[0].provider"),
    ]:
        error = refused(obj)
        assert [e.path for e in error.errors] == [path]
        assert len(str(error)) < 2000  # the value is not echoed back


json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
fields = st.sampled_from(
    ["replicas", "template", "spread", "maxAge", "recycleOnBlocks", "maxSurge", "autoscale"]
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        json,
        st.dictionaries(fields, json, max_size=4).map(lambda spec: pool(**spec)),
        st.lists(
            st.fixed_dictionaries({"provider": st.text(max_size=5), "weight": json}), max_size=3
        ).map(lambda spread: pool(spread=spread)),
    )
)
def test_any_object_is_a_pool_or_a_resource_error(obj: Any) -> None:
    """And whatever is accepted is a spec the fold takes as it is."""
    unknown_pool_fields(obj)
    try:
        _, spec = pool_from_object(obj)
    except ResourceError as exc:
        errors = exc.errors
    else:
        assert usable_spec(spec)
        return
    assert errors
    assert all(e.path and e.message for e in errors)


# --------------------------------------------------------------------------- member names


def test_a_member_name_is_derived_and_a_dns_label() -> None:
    uid = pool_uid("crawl", "de")
    assert uid == pool_uid("crawl", "de") != pool_uid("other", "de")
    name = member_name("de", uid, 0)
    assert name == member_name("de", uid, 0)  # two replicas name a member alike
    assert re.fullmatch(r"de-[bcdfghjklmnpqrstvwxz2456789]{5}", name)
    assert member_name("de", uid, 1) != name
    assert member_name("de", pool_uid("other", "de"), 0) != name


def test_a_member_of_the_longest_pool_name_is_a_dns_label() -> None:
    longest = "p" * MAX_POOL_NAME
    uid = pool_uid("crawl", longest)
    for ordinal in (0, 1, 10**6, 10**12 - 1):
        name = member_name(longest, uid, ordinal)
        assert len(name) == 63
        assert DNS_LABEL.match(name)


def test_member_names_over_the_most_replicas() -> None:
    """Names differ for nearly every ordinal; the few alike (5 characters hold 27**5 names) are
    skipped by the decider (test_pool_decide), so this bounds how many it skips."""
    uid = pool_uid("crawl", "de")
    names = [member_name("de", uid, ordinal) for ordinal in range(10_000)]
    assert all(DNS_LABEL.match(n) for n in names)
    assert len(set(names)) >= 10_000 - 20


@pytest.mark.parametrize("name", ["de\n", "de\r\n"])
def test_a_name_with_a_trailing_line_break_is_refused(name: str) -> None:
    """A pattern ending in ``$`` let "de\\n" through (``$`` matches before a final newline)."""
    obj = {"apiVersion": API_VERSION, "kind": "ProxyPool", "metadata": {"name": name}}
    obj["spec"] = {"replicas": 1, "template": {"provider": "local"}}
    with pytest.raises(ResourceError, match=r"metadata\.name"):
        pool_from_object(obj)
    proxy = {"apiVersion": API_VERSION, "kind": "Proxy", "metadata": {"name": name}}
    proxy["spec"] = {"provider": "local"}
    with pytest.raises(ResourceError, match=r"metadata\.name"):
        proxy_from_object(proxy)


# ------------------------------------------------------------------------------- autoscale


def test_autoscale_is_read_as_people_write_it() -> None:
    spec = accepted(
        pool(
            autoscale={
                "min": 5,
                "max": 100,
                "targetLeased": 0.8,
                "scaleUpAfter": "30s",
                "scaleDownAfter": "10m",
            }
        )
    )
    assert spec.autoscale == Autoscale(
        min=5,
        max=100,
        target_leased=0.8,
        scale_up_after_seconds=30.0,
        scale_down_after_seconds=600.0,
    )
    assert accepted(pool(autoscale={})).autoscale == Autoscale()
    assert accepted(pool()).autoscale is None


@pytest.mark.parametrize(
    ("autoscale", "path", "hint"),
    [
        ({"min": -1}, "spec.autoscale.min", "from 0 to 10000"),
        ({"max": 0}, "spec.autoscale.max", "from 1 to 10000"),
        ({"max": 10_001}, "spec.autoscale.max", "from 1 to 10000"),
        ({"min": 6, "max": 5}, "spec.autoscale.max", "at least min (6)"),
        ({"targetLeased": 0}, "spec.autoscale.targetLeased", "above 0, at most 1"),
        ({"targetLeased": 1.5}, "spec.autoscale.targetLeased", "above 0, at most 1"),
        ({"targetLeased": float("nan")}, "spec.autoscale.targetLeased", "above 0"),
        ({"targetLeased": float("inf")}, "spec.autoscale.targetLeased", "above 0"),
        ({"scaleUpAfter": "soon"}, "spec.autoscale.scaleUpAfter", "e.g. 30s"),
        ({"scaleDownAfter": "-1m"}, "spec.autoscale.scaleDownAfter", "e.g. 30s"),
        ({"scaleDownAfter": "200h"}, "spec.autoscale.scaleDownAfter", "at most 168h"),
        ({"scaleUpAfter": float("nan")}, "spec.autoscale.scaleUpAfter", "not a duration"),
    ],
)
def test_bad_autoscale_bounds_name_the_field_and_the_fix(
    autoscale: dict[str, Any], path: str, hint: str
) -> None:
    error = refused(pool(autoscale=autoscale))
    assert [e.path for e in error.errors] == [path], error.errors
    assert hint in error.errors[0].message


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "min": st.integers(-5, 20_000),
            "max": st.integers(-5, 20_000),
            "targetLeased": st.floats(allow_nan=True, allow_infinity=True),
            "scaleUpAfter": st.one_of(st.text(max_size=8), st.floats()),
            "scaleDownAfter": st.one_of(st.text(max_size=8), st.floats()),
        },
    )
)
@settings(max_examples=200, deadline=None)
def test_any_autoscale_is_usable_or_refused(autoscale: dict[str, Any]) -> None:
    """What validation lets through, the fold takes: no bound of the one is missing from the
    other."""
    spec: PoolSpec | None = None
    errors: list[str] = []
    try:
        _, spec = pool_from_object(pool(autoscale=autoscale))
    except ResourceError as exc:
        errors = [e.path for e in exc.errors]
    if spec is None:
        assert errors
        assert all(path.startswith("spec.autoscale.") for path in errors), errors
    else:
        assert usable_spec(spec)
