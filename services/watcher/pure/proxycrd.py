"""The Proxy CustomResourceDefinition, built from the structs the code decodes Proxies with.

``deploy/crd/proxies.yaml`` is this module's output (``egress-proxies crd > deploy/crd/
proxies.yaml``; a unit test fails when the two differ), so the apiserver can never accept a spec
field the watcher does not know, or reject one it does. The spec schema is msgspec's JSON Schema
of ``ProxySpec`` made structural (Kubernetes rejects ``$ref``, untyped nodes and ``anyOf`` with
types); the rules of ``events.proxyresource.validate`` that a schema can express are added as
patterns and bounds. Cross-field rules are CEL rules only, carrying the messages users read in
``kubectl apply`` errors: the apiserver runs no CEL rule once the schema has failed, so an
``anyOf`` doing their work would hide their messages (tests/integration/test_kube_real_crd.py
checks them on a real server). What no schema can express (a Secret's label) stays in the
watcher.

``ProxyStatus`` is the ``.status`` the watcher's status writer fills; its schema comes from the
same struct. What every CRD of ours is made of (a structural schema, the definition, the file)
is ``crdschema``'s, shared with the ProxyPool's. Pure: no I/O.
"""

from __future__ import annotations

import copy

import msgspec

from events.customresource import GROUP
from events.proxyresource import (
    KIND,
    MAX_ASN,
    MAX_EXPECTED_ASNS,
    MAX_PROBE_INTERVAL,
    MAX_PROBE_TIMEOUT,
    MAX_THRESHOLD,
    PLURAL,
    SHORT_NAME,
)
from events.schemas import Phase, ProxySpec
from services.watcher.pure.crdschema import (
    Schema,
    StatusCondition,
    definition,
    object_schema,
    render,
    structural,
    watcher_status,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
CLOUD_INIT_LABEL = f"{GROUP}/cloud-init"

# Condition types the status writer sets (``Ready`` summarises the others).
READY = "Ready"
PROVISIONED = "Provisioned"
HEALTHY = "Healthy"
CLOUD_INIT_ERROR = "CloudInitError"

# ``status.health``: one word for the HEALTH printer column.
HEALTH_HEALTHY = "Healthy"
HEALTH_UNHEALTHY = "Unhealthy"
HEALTH_UNKNOWN = "Unknown"


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

# Value rules of events.proxyresource.validate, by path in the spec (merged into the generated
# nodes).
_RULES: dict[str, Schema] = {
    "provider": {"pattern": "^[A-Za-z0-9_-]{0,63}$", "maxLength": 63},
    # Keys are checked by events.proxyresource.validate (the Proxy fails with InvalidSpec): a CEL
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


def render_yaml() -> str:
    """The text of ``deploy/crd/proxies.yaml``."""
    return render(proxy_crd(), "egress-proxies crd > deploy/crd/proxies.yaml")
