"""Reading a generated CustomResourceDefinition as the tests check it: its schema, a validator
for documents against it, and every node of the schema with its path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema


def version(crd: Mapping[str, Any]) -> dict[str, Any]:
    """The CRD's one served version."""
    served: dict[str, Any] = crd["spec"]["versions"][0]
    return served


def openapi_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = version(crd)["schema"]["openAPIV3Schema"]
    return schema


def validator(crd: Mapping[str, Any]) -> jsonschema.Draft4Validator:
    # openAPIV3Schema is OpenAPI 3.0's JSON Schema dialect: draft 4 (boolean exclusiveMinimum).
    return jsonschema.Draft4Validator(openapi_schema(crd))


def schema_nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node outside logical junctors (where Kubernetes forbids types)."""
    if not isinstance(node, dict):
        return
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from schema_nodes(node[key], f"{path}[{key}]")
