"""The Proxy CRD: generated from the structs, structural, committed as generated, and as strict
as ``events.proxyresource.validate`` where a schema can be."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml
from click.testing import CliRunner

from events.customresource import ResourceError
from events.proxyresource import from_object
from events.schemas import Phase
from services.cli.main import main
from services.watcher.pure.crdschema import StatusCondition, structural
from services.watcher.pure.proxycrd import (
    CLOUD_INIT_ERROR,
    HEALTH_HEALTHY,
    PRINTER_COLUMNS,
    READY,
    ProxyStatus,
    proxy_crd,
    render_yaml,
)
from tests.support.crd_schema import openapi_schema, schema_nodes, validator

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "crd" / "proxies.yaml"


def _schema() -> dict[str, Any]:
    return openapi_schema(proxy_crd())


def _validator() -> jsonschema.Draft4Validator:
    return validator(proxy_crd())


def _examples() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "deploy" / "examples").glob("*.yaml")):
        docs += [
            d
            for d in yaml.safe_load_all(path.read_text())
            if isinstance(d, dict) and d.get("kind") == "Proxy"
        ]
    return docs


def test_committed_crd_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == render_yaml(), (
        "deploy/crd/proxies.yaml is stale: regenerate it with "
        "`egress-proxies crd > deploy/crd/proxies.yaml`"
    )


def test_the_cli_prints_the_crd() -> None:
    result = CliRunner().invoke(main, ["crd"])
    assert result.exit_code == 0, result.output
    assert result.output == render_yaml()
    assert yaml.safe_load(result.output) == proxy_crd()


def test_the_schema_is_structural() -> None:
    for path, node in schema_nodes(_schema()):
        assert "type" in node, f"{path or '$'} has no type"
        assert not {"$ref", "title", "default"} & set(node), path
        for junctor in ("anyOf", "oneOf", "allOf", "not"):
            for sub in node.get(junctor, []) if junctor != "not" else [node.get("not") or {}]:
                assert not {"type", "description"} & set(sub), f"{path}.{junctor}"


def test_structural_rejects_what_kubernetes_would() -> None:
    with pytest.raises(ValueError, match="untyped"):
        structural({"properties": {"x": {}}, "type": "object"})
    with pytest.raises(ValueError, match="one non-null option"):
        structural({"anyOf": [{"type": "string"}, {"type": "integer"}]})


def test_names_columns_and_status_subresource() -> None:
    crd = proxy_crd()
    assert crd["metadata"]["name"] == "proxies.crawl.example.com"
    assert crd["spec"]["names"]["shortNames"] == ["px"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"].upper(), c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns[:5] == [
        ("PHASE", ".status.phase"),
        ("IP", ".status.ip"),
        ("PROVIDER", ".spec.provider"),
        ("HEALTH", ".status.health"),
        ("AGE", ".metadata.creationTimestamp"),
    ]


def test_every_printer_column_points_at_a_schema_field() -> None:
    schema = _schema()
    for column in PRINTER_COLUMNS:
        node = schema
        for part in column["jsonPath"].strip(".").split("."):
            if part in ("metadata",) and node is schema:
                break
            node = node["properties"][part]
        assert node.get("type") in ("string", "number", "integer") or node is schema


def test_the_examples_are_valid_both_ways() -> None:
    examples = _examples()
    assert len(examples) >= 3  # proxy, proxy-external, gcp-proxy
    for doc in examples:
        _validator().validate(doc)
        from_object(doc)  # the watcher would accept it too


def _base() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "examples" / "proxy.yaml").read_text())
    return doc


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value

    return mutate


INVALID = {
    "provider with a space": _set("spec.provider", "my provider"),
    "unknown mode": _set("spec.mode", "Hybrid"),
    "zero interval": _set("spec.healthCheck.intervalSeconds", 0),
    "negative timeout": _set("spec.healthCheck.timeoutSeconds", -1),
    "failure threshold 0": _set("spec.healthCheck.failureThreshold", 0),
    "success threshold 0": _set("spec.healthCheck.successThreshold", 0),
    "ftp health url": _set("spec.healthCheck.url", "ftp://example.com/"),
    "attribute value too long": _set("spec.attributes.pool", "x" * 257),
    "attribute value not a string": _set("spec.attributes.pool", 5),
    "secretRef without name": _set("spec.cloudInit", {"secretRef": {"key": "userdata"}}),
    "name not a DNS label": _set("metadata.name", "Squid_1"),
}


CROSS_FIELD = {
    "managed without provider": (_set("spec.provider", ...), "provider is required"),
    "external without url": (_set("spec.mode", "External"), "external.url is required"),
    "managed with an external url": (
        _set("spec.external", {"url": "http://10.0.0.1:3128"}),
        "external.url is only for mode External",
    ),
    "inline and secretRef": (
        _set("spec.cloudInit", {"inline": "#cloud-config", "secretRef": {"name": "s"}}),
        "either inline or secretRef",
    ),
}
"""Refused by CEL rules (a JSON Schema validator does not run them; the real apiserver does, in
tests/integration/test_kube_real_crd.py), and by the code."""


@pytest.mark.parametrize("mutation", list(CROSS_FIELD), ids=list(CROSS_FIELD))
def test_cross_field_mistakes_have_a_cel_rule_and_are_rejected_by_the_code(mutation: str) -> None:
    mutate, message = CROSS_FIELD[mutation]
    spec = _schema()["properties"]["spec"]
    rules = (
        spec["x-kubernetes-validations"]
        + spec["properties"]["cloudInit"]["x-kubernetes-validations"]
    )
    assert any(message in rule["message"] for rule in rules)
    doc = _base()
    mutate(doc)
    with pytest.raises(ResourceError):
        from_object(doc)


@pytest.mark.parametrize("mutation", list(INVALID), ids=list(INVALID))
def test_invalid_proxies_are_rejected_by_the_schema_and_the_code(mutation: str) -> None:
    doc = _base()
    INVALID[mutation](doc)
    errors = list(_validator().iter_errors(doc))
    assert errors, f"the CRD schema accepts: {mutation}"
    with pytest.raises(ResourceError):
        from_object(doc)


def test_external_proxies_need_a_proxy_url() -> None:
    doc = _base()
    doc["spec"] = {"mode": "External", "external": {"url": "socks5://10.0.0.7:1080"}}
    _validator().validate(doc)
    doc["spec"]["external"]["url"] = "10.0.0.7:1080"
    assert list(_validator().iter_errors(doc))


def test_cross_field_rules_carry_messages_for_kubectl() -> None:
    spec = _schema()["properties"]["spec"]
    rules = (
        spec["x-kubernetes-validations"]
        + spec["properties"]["cloudInit"]["x-kubernetes-validations"]
    )
    assert all(rule["rule"] and rule["message"] for rule in rules)
    assert any("provider is required" in rule["message"] for rule in rules)


def test_a_full_status_fits_the_status_schema() -> None:
    status = ProxyStatus(
        phase=Phase.READY,
        ip="10.244.0.7",
        url="http://10.244.0.7:3128",
        provider_id="crawlers/px-1",
        observed_generation=2,
        health=HEALTH_HEALTHY,
        latency_ms=12.5,
        conditions=[
            StatusCondition(
                type=READY,
                status="True",
                reason="Healthy",
                last_transition_time="2026-01-01T00:00:00Z",
            ),
            StatusCondition(type=CLOUD_INIT_ERROR, status="False", reason="Resolved"),
        ],
    )
    encoded = msgspec.to_builtins(status)
    assert encoded["providerID"] == "crawlers/px-1"
    assert encoded["observedGeneration"] == 2
    doc = _base() | {"status": encoded}
    _validator().validate(doc)
    doc["status"]["conditions"][0]["status"] = "Maybe"
    assert list(_validator().iter_errors(doc))
    assert msgspec.to_builtins(ProxyStatus()) == {}
