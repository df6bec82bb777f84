"""The ProxyPool CRD: generated from the manifest parser's structs, committed as generated (in
deploy/ and in the Helm chart), structural, with the scale subresource an HPA needs, and as strict
as ``events.poolresource`` where a schema can be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml
from click.testing import CliRunner

from events.customresource import ResourceError
from events.pool import MAX_REPLICAS
from events.poolresource import from_object
from services.cli.main import main
from services.watcher.pure.crdschema import StatusCondition
from services.watcher.pure.poolcrd import (
    POOL_PRINTER_COLUMNS,
    DecisionStatus,
    PoolStatus,
    proxypool_crd,
    render_pool_yaml,
)
from tests.support.crd_schema import openapi_schema, schema_nodes, validator, version

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "crd" / "proxypools.yaml"
CHART_COPY = ROOT / "deploy" / "helm" / "egress-proxies" / "crds" / "proxypools.yaml"


def _version() -> dict[str, Any]:
    return version(proxypool_crd())


def _schema() -> dict[str, Any]:
    return openapi_schema(proxypool_crd())


def _validator() -> jsonschema.Draft4Validator:
    return validator(proxypool_crd())


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"replicas": 3, "template": {"provider": "local"}}
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "de", "namespace": "crawl"},
        "spec": {**base, **spec},
    }


def test_committed_crd_and_the_charts_copy_are_the_generated_one() -> None:
    fix = "regenerate: egress-proxies crd --kind ProxyPool > deploy/crd/proxypools.yaml"
    assert COMMITTED.read_text() == render_pool_yaml(), fix
    assert CHART_COPY.read_text() == render_pool_yaml(), f"copy {COMMITTED} into the chart"


def test_the_cli_prints_the_pool_crd() -> None:
    result = CliRunner().invoke(main, ["crd", "--kind", "ProxyPool"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == proxypool_crd()


def test_the_schema_is_structural() -> None:
    for path, node in schema_nodes(_schema()):
        assert "$ref" not in node, path
        assert "anyOf" not in node, path
        assert "default" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True, path


def test_the_scale_subresource_reads_and_writes_what_the_watcher_does() -> None:
    version = _version()
    scale = version["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    status = _schema()["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["selector"]["type"] == "string"
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["replicas"]["maximum"] == MAX_REPLICAS
    assert "status" in version["subresources"]


def test_every_printer_column_points_at_a_schema_field() -> None:
    names = [c["name"] for c in POOL_PRINTER_COLUMNS if not c.get("priority")]
    assert names == ["Desired", "Members", "Ready", "Leased", "Age"]
    for column in POOL_PRINTER_COLUMNS:
        node = _schema()
        parts = column["jsonPath"].lstrip(".").split(".")
        if parts[0] == "metadata":
            continue
        for part in parts:
            node = node["properties"][part]
        kinds = {"integer": "integer", "string": "string"}
        assert node["type"] == kinds[column["type"]], column


def test_a_full_status_fits_the_status_schema() -> None:
    status = PoolStatus(
        observed_generation=2,
        desired=5,
        replicas=5,
        ready=4,
        healthy=4,
        leased=1,
        available=3,
        selector="pool=de",
        conditions=[StatusCondition(type="Ready", status="False", reason="MembersNotReady")],
        last_decision=DecisionStatus(
            reason="ScaleUp", message="2 added", at="2026-01-01T00:00:00Z"
        ),
    )
    _validator().validate({**pool(), "status": msgspec.to_builtins(status)})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": MAX_REPLICAS + 1}, "replicas"),
        ({"replicas": -1}, "replicas"),
        ({"maxSurge": 0}, "maxSurge"),
        ({"recycleOnBlocks": 1001}, "recycleOnBlocks"),
        ({"spread": [{"provider": "a b"}]}, "provider"),
        ({"spread": [{"provider": "a", "weight": 0}]}, "weight"),
        ({"template": {"provider": "local", "healthCheck": {"intervalSeconds": "often"}}}, "often"),
    ],
)
def test_what_the_schema_refuses_the_parser_refuses_too(spec: dict[str, Any], field: str) -> None:
    obj = pool(**spec)
    errors = [str(e.message) + str(list(e.path)) for e in _validator().iter_errors(obj)]
    assert any(field in e for e in errors), errors
    with pytest.raises(ResourceError):
        from_object(obj)


def test_a_valid_pool_passes_both() -> None:
    obj = pool(
        spread=[{"provider": "gcp-eu", "weight": 2}, {"provider": "kvm", "weight": 1}],
        template={"attributes": {"country": "de"}},
        maxAge="6h",
    )
    _validator().validate(obj)
    from_object(obj)
    _validator().validate(pool(maxAge=3600))


def test_cross_field_rules_carry_the_parsers_meaning() -> None:
    """CEL is run by the apiserver (tests/integration/test_kube_real_pools.py); here each rule
    has a message naming the field, and the parser refuses the same pools."""
    spec = _schema()["properties"]["spec"]
    template = spec["properties"]["template"]
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    messages += [r["message"] for r in template["x-kubernetes-validations"]]
    assert any("spec.template.provider" in m for m in messages)
    assert any("mode" in m for m in messages)
    assert any("attributes.pool" in m for m in messages)
    for bad in (
        pool(template={}),
        pool(spread=[{"provider": "a"}]),
        pool(template={"provider": "local", "attributes": {"pool": "x"}}),
        pool(template={"provider": "local", "mode": "External"}),
    ):
        with pytest.raises(ResourceError):
            from_object(bad)
