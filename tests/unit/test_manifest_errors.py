"""A refused file names itself once and each problem by document and field."""

from __future__ import annotations

import pytest

from events.customresource import ResourceError
from services.cli.fleet.manifests import parse_resources

GOOD = "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: n}\n"


def test_each_problem_names_its_document_and_field_and_the_file_once() -> None:
    text = (
        GOOD
        + "spec: {provider: local, atributes: {a: b}}\n---\n"
        + GOOD.replace("name: a", "name: b")
        + "spec: {provider: local, healthCheck: {intervalSeconds: -1}}\n"
    )
    with pytest.raises(ResourceError) as refused:
        parse_resources(text, "f.yaml")
    message = str(refused.value)
    assert message.count("f.yaml") == 1, message
    assert message.startswith("f.yaml: document 1: spec.atributes: unknown field")
    assert "; document 2: spec.healthCheck.intervalSeconds: must be more than 0" in message
    assert "$:" not in message
