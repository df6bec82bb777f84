"""``apply`` reports every problem of its files, not only the first
(docs/decisions/0147-the-cli-as-one-language.md): two wrong fields of one document, an unknown
field beside a wrong one, two bad pool fields, and two bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.customresource import ResourceError
from services.cli.fleet.manifests import parse_documents
from tests.support.clirun import cli, restore_logging_after

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

HEAD = "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata: {name: a, namespace: n}\n"
POOL = (
    "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\n"
    "metadata: {name: de, namespace: crawl}\n"
)


def problems(text: str, validate: str = "strict") -> str:
    with pytest.raises(ResourceError) as refused:
        parse_documents(text, "f.yaml", validate=validate)
    return str(refused.value)


def test_two_wrong_fields_of_one_proxy_are_both_named() -> None:
    message = problems(HEAD + "spec: {provider: local, attributes: {a: 5}, mode: nonsense}\n")
    assert "document 1: $.spec.attributes[...]: Expected `str`, got `int`" in message
    assert "document 1: $.spec.mode: Invalid enum value 'nonsense'" in message
    # Taking a wrong field out to read on never reports it missing.
    assert "missing" not in message


def test_a_wrong_field_beside_a_required_one_is_not_reported_missing() -> None:
    message = problems(HEAD + "spec: {provider: 5, mode: nonsense}\n")
    assert "$.spec.provider: Expected `str`, got `int`" in message
    assert "$.spec.mode: Invalid enum value" in message
    assert "missing" not in message


def test_what_the_checks_after_decoding_find_is_named_too() -> None:
    text = HEAD.replace("name: a", "name: A_") + "spec: {attributes: {a: 5}}\n"
    message = problems(text)
    assert "$.spec.attributes[...]: Expected `str`" in message
    assert "document 1: metadata.name: use 1-63 lowercase" in message
    assert "document 1: spec.provider: required" in message


def test_an_unknown_field_does_not_hide_a_wrong_one() -> None:
    message = problems(HEAD + "spec: {provider: local, ttl: 1h, mode: nonsense}\n")
    assert "spec.ttl: unknown field" in message
    assert "$.spec.mode: Invalid enum value" in message


def test_two_wrong_fields_of_a_pool_are_both_named() -> None:
    text = POOL + "spec: {replicas: many, template: {provider: 5}}\n"
    message = problems(text)
    assert "$.spec.replicas: Expected `int`, got `str`" in message
    assert "$.spec.template.provider: Expected `str`, got `int`" in message


async def test_apply_names_the_problems_of_every_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(HEAD + "spec: {provider: local, mode: nonsense}\n")
    second.write_text(HEAD + "spec: {provider: 5}\n")
    refused = await cli("apply", "-f", str(first), "-f", str(second))
    assert refused.exit_code == 2, refused.output
    assert "a.yaml: document 1: $.spec.mode" in refused.output
    assert "b.yaml: document 1: $.spec.provider" in refused.output
