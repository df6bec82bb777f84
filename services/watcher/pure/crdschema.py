"""What every CustomResourceDefinition of ours is made of, whichever its kind (Proxy, ProxyPool):
a structural openAPIV3Schema from msgspec's JSON Schema of a struct, the ``.status`` the watcher
writes, the whole object's schema, the definition in ``GROUP`` and its generated file. Each kind
(``proxycrd``, ``poolcrd``) adds only its own rules, descriptions and columns. Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from events.customresource import API_VERSION, GROUP, VERSION

Schema = dict[str, Any]

FINALIZER = f"{GROUP}/finalizer"
"""The watcher's finalizer on every object it brings into the log (a Proxy, a ProxyPool)."""
CATEGORIES = ("egress", "crawl")


class StatusCondition(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """One condition, in the shape of metav1.Condition (what ``kubectl describe`` lists)."""

    type: str
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str = ""
    """CamelCase, machine-readable: why the condition has this status."""
    message: str = ""
    last_transition_time: str = ""
    """RFC 3339 time the status last changed (not when the message did)."""
    observed_generation: int = 0


_DROP = ("title", "default", "$defs")


def structural(schema: Schema) -> Schema:
    """A structural openAPIV3Schema from msgspec's JSON Schema: refs inlined, every node typed,
    ``anyOf [X, null]`` as a nullable X, no titles or defaults (defaulting would write values
    into stored objects that the structs already default when decoding)."""
    defs = schema.get("$defs", {})

    def convert(node: Schema) -> Schema:
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return convert(merged)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"cannot make {node} structural: one non-null option expected")
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            result = convert({**rest, **options[0]})
            result["nullable"] = True
            return result
        out: Schema = {}
        for key, value in node.items():
            if key in _DROP or (key == "required" and not value):
                continue
            if key == "properties":
                out[key] = {name: convert(sub) for name, sub in value.items()}
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = convert(value)
            else:
                out[key] = copy.deepcopy(value)
        if "enum" in out and "type" not in out:
            kinds = {type(v) for v in out["enum"]}
            if kinds != {str}:
                raise ValueError(f"enum {out['enum']} is not all strings")
            out["type"] = "string"
        if "type" not in out:
            raise ValueError(f"untyped schema node {node}")
        return out

    root = schema if "$ref" not in schema else {"$ref": schema["$ref"]}
    return convert(root)


def watcher_status(struct: type[msgspec.Struct]) -> Schema:
    """The schema of a ``.status`` the watcher writes from ``struct``: its conditions a map
    keyed by type, as ``kubectl`` and server-side apply expect of metav1.Conditions."""
    schema = structural(msgspec.json.schema(struct))
    schema["description"] = "Observed state, written by the watcher from the event log."
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["properties"]["status"]["enum"] = ["True", "False", "Unknown"]
    return schema


def object_schema(description: str, *, name: Schema, spec: Schema, status: Schema) -> Schema:
    """The whole object's openAPIV3Schema; ``name`` constrains ``metadata.name`` (only name and
    generateName may be constrained)."""
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": name}},
            "spec": spec,
            "status": status,
        },
    }


def definition(
    *,
    kind: str,
    plural: str,
    short_name: str,
    subresources: Schema,
    columns: Iterable[Schema],
    schema: Schema,
) -> Schema:
    """A namespaced CustomResourceDefinition in ``GROUP``, served and stored as ``VERSION``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "egress-proxies"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short_name],
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": [dict(c) for c in columns],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def render(crd: Schema, regenerate: str) -> str:
    """A generated CRD's file: a header saying how to ``regenerate`` it, then the YAML."""
    kind = crd["spec"]["names"]["kind"]
    header = (
        f"# The {kind} CRD ({API_VERSION}). Generated from the code's structs: do not edit.\n"
        f"# Regenerate with: {regenerate}\n"
    )
    return header + yaml.safe_dump(crd, sort_keys=False, width=100)
