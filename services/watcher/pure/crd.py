"""The Proxy CustomResourceDefinition, built from the structs the code decodes Proxies with.

``deploy/crd/proxies.yaml`` is this module's output (``egress-proxies crd > deploy/crd/
proxies.yaml``; a unit test fails when the two differ), so the apiserver can never accept a spec
field the watcher does not know, or reject one it does. The spec schema is msgspec's JSON Schema
of ``ProxySpec`` made structural (Kubernetes rejects ``$ref``, untyped nodes and ``anyOf`` with
types); the rules of ``events.resource.validate`` that a schema can express are added as
patterns and bounds. Cross-field rules are CEL rules only, carrying the messages users read in
``kubectl apply`` errors: the apiserver runs no CEL rule once the schema has failed, so an
``anyOf`` doing their work would hide their messages (tests/integration/test_kube_real_crd.py
checks them on a real server). What no schema can express (a Secret's label) stays in the
watcher.

``ProxyStatus`` is the ``.status`` the watcher's status writer fills; its schema comes from the
same struct. Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from events.resource import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_ASN,
    MAX_EXPECTED_ASNS,
    MAX_PROBE_INTERVAL,
    MAX_PROBE_TIMEOUT,
    MAX_THRESHOLD,
    PLURAL,
    SHORT_NAME,
    VERSION,
)
from events.schemas import Phase, ProxySpec

Schema = dict[str, Any]

CRD_NAME = f"{PLURAL}.{GROUP}"
FINALIZER = f"{GROUP}/finalizer"
CLOUD_INIT_LABEL = f"{GROUP}/cloud-init"
CATEGORIES = ("egress", "crawl")

# Condition types the status writer sets (``Ready`` summarises the others).
READY = "Ready"
PROVISIONED = "Provisioned"
HEALTHY = "Healthy"
CLOUD_INIT_ERROR = "CloudInitError"

# ``status.health``: one word for the HEALTH printer column.
HEALTH_HEALTHY = "Healthy"
HEALTH_UNHEALTHY = "Unhealthy"
HEALTH_UNKNOWN = "Unknown"


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


class ProxyStatus(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """``.status`` of a Proxy: a projection of its events, written through the status
    subresource by the watcher's status writer. Empty fields are left out."""

    phase: Phase | None = None
    reason: str = ""
    message: str = ""
    ip: str = ""
    url: str = ""
    """How to use the proxy, e.g. http://10.244.0.7:3128."""
    provider_id: str = msgspec.field(default="", name="providerID")
    observed_generation: int = 0
    """The spec generation the status describes."""
    health: str = ""
    """Healthy, Unhealthy or Unknown: the HEALTH column."""
    latency_ms: float | None = None
    """Latency of the last health probe through the proxy, in milliseconds."""
    conditions: list[StatusCondition] = msgspec.field(default_factory=list)


# Descriptions for `kubectl explain`, by path in the spec (the structs carry none).
_DESCRIPTIONS: dict[str, str] = {
    "": "What the proxy should be. Changing mode, provider, placement or cloudInit replaces "
    "the instance (new IP); attributes and healthCheck apply in place.",
    "mode": "Managed: provisioned on a provider. External: an existing proxy, probed and "
    "leased but never created or deleted.",
    "provider": "Name of a provider instance from the providers config (--providers-config), "
    "e.g. local or k8s. Required for mode Managed.",
    "placement": "Where the instance runs; the provider decides what each field means.",
    "attributes": "Labels crawlers select proxies by when they lease one (e.g. country: de).",
    "cloudInit": "User data for VM providers: inline, or from a Secret labelled "
    f'{CLOUD_INIT_LABEL}: "true" in the Proxy\'s namespace.',
    "cloudInit.secretRef": "The Secret (same namespace) and key holding the user data.",
    "external": "For mode External: the proxy to use.",
    "external.url": "http://, https://, socks5:// or socks5h:// URL of the proxy.",
    "healthCheck": "How the proxy is probed through itself.",
    "healthCheck.url": "URL fetched through the proxy; empty: the service's default.",
    "egress": "What a site must see of the proxy: its egress is checked through it and a proxy "
    "that does not match is not leased.",
    "egress.expect.country": "ISO 3166 alpha-2 code (de) the public address must be in.",
    "egress.expect.asn": "Autonomous system numbers (3320) the address may belong to.",
    "egress.onMismatch": "keep: out of leasing until it matches; replace: replaced "
    "make-before-break, a bounded number of times.",
    "egressCheck.url": "Echo URL fetched through the proxy that answers the caller's address; "
    "empty: the provider's or the service's default.",
}

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Value rules of events.resource.validate, by path in the spec (merged into the generated nodes).
_RULES: dict[str, Schema] = {
    "provider": {"pattern": "^[A-Za-z0-9_-]{0,63}$", "maxLength": 63},
    # Keys are checked by events.resource.validate (the Proxy fails with InvalidSpec): a CEL
    # rule over unbounded map keys would exceed the apiserver's rule cost budget.
    "attributes.*": {"maxLength": 256},
    # Cross-field rules are CEL only: a failing anyOf would stop the apiserver before it runs
    # the CEL rules, and users would read "must validate at least one schema (anyOf)" instead of
    # the messages below.
    "cloudInit": {
        "x-kubernetes-validations": [
            {
                "rule": "!(has(self.secretRef) && has(self.inline) && size(self.inline) > 0)",
                "message": "set either inline or secretRef, not both",
            }
        ],
    },
    "cloudInit.secretRef.name": {"pattern": _DNS_SUBDOMAIN, "maxLength": 253},
    "cloudInit.secretRef.key": {"pattern": "^[-._a-zA-Z0-9]+$", "maxLength": 253},
    "external.url": {"pattern": r"^((https?|socks5h?)://\S+)?$"},
    "healthCheck.url": {"pattern": r"^(https?://\S+)?$"},
    "egress.expect.country": {"pattern": "^([A-Za-z]{2})?$"},
    "egress.expect.asn": {"maxItems": MAX_EXPECTED_ASNS},
    "egress.expect.asn.*": {"minimum": 1, "maximum": MAX_ASN},
    "egressCheck.url": {"pattern": r"^(https?://\S+)?$"},
    "healthCheck.intervalSeconds": {
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_PROBE_INTERVAL,
    },
    "healthCheck.timeoutSeconds": {
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_PROBE_TIMEOUT,
    },
    "healthCheck.failureThreshold": {"minimum": 1, "maximum": MAX_THRESHOLD},
    "healthCheck.successThreshold": {"minimum": 1, "maximum": MAX_THRESHOLD},
    # Managed needs a provider and no external URL; External needs an external URL.
    "": {
        "x-kubernetes-validations": [
            {
                "rule": "(has(self.mode) && self.mode == 'External') || "
                "(has(self.provider) && size(self.provider) > 0)",
                "message": "provider is required for mode Managed: the name of a provider "
                "instance from the providers config (e.g. local)",
            },
            {
                "rule": "!(has(self.mode) && self.mode == 'External') || "
                "(has(self.external) && has(self.external.url) && size(self.external.url) > 0)",
                "message": "external.url is required for mode External, e.g. http://10.0.0.5:3128",
            },
            {
                "rule": "(has(self.mode) && self.mode == 'External') || "
                "!has(self.external) || !has(self.external.url) || size(self.external.url) == 0",
                "message": "external.url is only for mode External; remove it, or set mode: "
                "External",
            },
        ],
    },
}

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


def _node(schema: Schema, path: str) -> Schema:
    node = schema
    for part in [p for p in path.split(".") if p]:
        if part == "*":
            node = node["items"] if "items" in node else node["additionalProperties"]
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            raise KeyError(f"spec path {path!r} is not in the ProxySpec schema")
    return node


def spec_schema() -> Schema:
    schema = structural(msgspec.json.schema(ProxySpec))
    for path, rules in _RULES.items():
        _node(schema, path).update(copy.deepcopy(rules))
    for path, text in _DESCRIPTIONS.items():
        _node(schema, path)["description"] = text
    return schema


def status_schema() -> Schema:
    schema = watcher_status(ProxyStatus)
    # The writer leaves empty fields out rather than writing null; an enum would refuse null.
    schema["properties"]["phase"].pop("nullable", None)
    schema["properties"]["health"]["enum"] = [
        "",
        HEALTH_HEALTHY,
        HEALTH_UNHEALTHY,
        HEALTH_UNKNOWN,
    ]
    return schema


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


def proxy_schema() -> Schema:
    """The whole object's openAPIV3Schema."""
    return object_schema(
        "An egress proxy for crawlers: one Squid instance on a provider.",
        # The watcher needs a DNS label.
        name={"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
        spec=spec_schema(),
        status=status_schema(),
    )


PRINTER_COLUMNS: tuple[Schema, ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "IP", "type": "string", "jsonPath": ".status.ip"},
    {"name": "Provider", "type": "string", "jsonPath": ".spec.provider"},
    {"name": "Health", "type": "string", "jsonPath": ".status.health"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 1},
)


def proxy_crd() -> Schema:
    """The CustomResourceDefinition for ``proxies.crawl.example.com``."""
    return definition(
        kind=KIND,
        plural=PLURAL,
        short_name=SHORT_NAME,
        subresources={"status": {}},
        columns=PRINTER_COLUMNS,
        schema=proxy_schema(),
    )


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


def render_yaml() -> str:
    """The text of ``deploy/crd/proxies.yaml``."""
    return render(proxy_crd(), "egress-proxies crd > deploy/crd/proxies.yaml")


def render(crd: Schema, regenerate: str) -> str:
    """A generated CRD's file: a header saying how to ``regenerate`` it, then the YAML."""
    kind = crd["spec"]["names"]["kind"]
    header = (
        f"# The {kind} CRD ({API_VERSION}). Generated from the code's structs: do not edit.\n"
        f"# Regenerate with: {regenerate}\n"
    )
    return header + yaml.safe_dump(crd, sort_keys=False, width=100)
