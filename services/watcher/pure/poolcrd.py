"""The ProxyPool CustomResourceDefinition, built from the structs ``events.poolresource`` decodes
a ProxyPool with (docs/pools.md, "On Kubernetes").

``deploy/crd/proxypools.yaml`` is this module's output (``egress-proxies crd --kind ProxyPool``;
a unit test fails when the two differ). The template's schema is the Proxy CRD's spec schema
(``proxycrd.spec_schema``), without the rule that a Managed Proxy names its provider: in a pool the
spread may name them, which a CEL rule on the pool's spec checks instead. The bounds of
``events.poolresource.validate`` are written as schema bounds so ``kubectl`` refuses what the
watcher would refuse; what a schema cannot say (a duration's text) the watcher still checks, and
an invalid pool gets a condition, never a crash.

The ``scale`` subresource (``kubectl scale proxypool de --replicas=30``, a
HorizontalPodAutoscaler, KEDA) reads and writes ``spec.replicas``; ``status.selector`` is the
members' label selector. ``PoolStatus`` is the ``.status`` the watcher writes. Pure: no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from events.customresource import GROUP
from events.pool import MAX_BLOCKS, MAX_REPLICAS, MAX_SPREAD, MAX_SURGE, MAX_WEIGHT
from events.poolresource import KIND, PLURAL, POOL_ATTRIBUTE, SHORT_NAME, PoolSpecDoc
from services.watcher.pure.crdschema import (
    Schema,
    StatusCondition,
    definition,
    object_schema,
    render,
    structural,
    watcher_status,
)
from services.watcher.pure.proxycrd import spec_schema

POOL_CRD_NAME = f"{PLURAL}.{GROUP}"
POOL_LABEL = POOL_ATTRIBUTE
"""The label every member's mirror carries (``kubectl get px -l pool=de``), as its attribute."""
MIRROR_ANNOTATION = f"{GROUP}/pool-member"
"""On a member's mirror Proxy: the member's uid in the log. The mirror is no Proxy of its own;
its truth is the pool (docs/pools.md, "On Kubernetes")."""

# Condition types of a pool's status.
READY = "Ready"
"""Every member it asks for is Ready and healthy."""
SCALING = "Scaling"
"""It has fewer or more members than it asks for, or members rotating."""
INVALID_SPEC = "InvalidSpec"
"""The resource is refused by ``events.poolresource`` (the reason names the field)."""


class DecisionStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The pool controller's last decision, as ``egress-proxies describe pool`` shows it."""

    reason: str = ""
    message: str = ""
    at: str = ""
    """RFC 3339 time the decision was recorded."""


class PoolStatus(msgspec.Struct, kw_only=True, rename="camel"):
    """``.status`` of a ProxyPool: figures counted from the log as the pool controller counts
    them (``projections.pool_members.figures``). Every field is written, zeros too: a column
    shows 0, not <none>."""

    observed_generation: int = 0
    desired: int = 0
    """Members asked for (``spec.replicas``, or the last scale)."""
    replicas: int = 0
    """Members planned: the scale subresource's ``status.replicas``."""
    ready: int = 0
    healthy: int = 0
    """Ready and probed healthy."""
    leased: int = 0
    available: int = 0
    """Ready, healthy and free to lease now."""
    selector: str = ""
    """The members' label selector (``pool=<name>``), for the scale subresource."""
    conditions: list[StatusCondition] = msgspec.field(default_factory=list)
    last_decision: DecisionStatus | None = None


_TEMPLATE_RULES: list[Schema] = [
    {
        "rule": "!has(self.mode) || self.mode == 'Managed'",
        "message": "a pool runs Managed proxies on its providers; remove spec.template.mode",
    },
    {
        "rule": f"!has(self.attributes) || !('{POOL_ATTRIBUTE}' in self.attributes)",
        "message": f"attributes.{POOL_ATTRIBUTE} is set by the pool on every member; remove it",
    },
    {
        "rule": "!has(self.cloudInit) || !has(self.cloudInit.secretRef)",
        "message": "cloudInit.secretRef is not yet for pools; use cloudInit.inline",
    },
]
_SPEC_RULES: list[Schema] = [
    {
        "rule": "(has(self.spread) && size(self.spread) > 0) || (has(self.template) && "
        "has(self.template.provider) && size(self.template.provider) > 0)",
        "message": "name the provider: spec.template.provider, or providers in spec.spread",
    },
    {
        "rule": "!(has(self.spread) && size(self.spread) > 0 && has(self.template) && "
        "has(self.template.provider) && size(self.template.provider) > 0)",
        "message": "the spread names the providers; remove spec.template.provider or the spread",
    },
]
_DESCRIPTIONS: dict[str, str] = {
    "replicas": f"Members wanted, 0 to {MAX_REPLICAS}; the scale subresource sets it.",
    "template": "The Proxy spec of every member; the pool adds the attribute "
    f"{POOL_ATTRIBUTE}: <pool name>.",
    "spread": "Provider instances and weights; members are placed by largest remainders.",
    "maxAge": "Members older than this get a fresh instance, make-before-break: 30s, 10m, 6h, "
    "1h30m or whole seconds; 0 never.",
    "recycleOnBlocks": "A member blocked by this many distinct targets gets a fresh instance; "
    "0 never.",
    "maxSurge": "Members rotating or re-declared at once.",
}


_DURATION = "x-egress-duration"


def _durations(node: Any) -> Any:
    """Before ``structural``: a duration (``str | float``, e.g. ``maxAge``) marked as a string,
    which no structural schema can say otherwise."""
    if isinstance(node, list):
        return [_durations(n) for n in node]
    if not isinstance(node, dict):
        return node
    kinds = sorted(str(o.get("type")) for o in node.get("anyOf", []) if isinstance(o, dict))
    if kinds == ["number", "string"]:
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
        return {**rest, "type": "string", _DURATION: True}
    return {k: _durations(v) for k, v in node.items()}


def _int_or_string(node: Any) -> Any:
    """After ``structural``: each duration is int-or-string (``6h``, or whole seconds); the
    watcher parses and bounds it with the CLI's parser."""
    if isinstance(node, list):
        return [_int_or_string(n) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get(_DURATION):
        rest = {k: v for k, v in node.items() if k not in ("type", _DURATION)}
        return {**rest, "x-kubernetes-int-or-string": True}
    return {k: _int_or_string(v) for k, v in node.items()}


def pool_spec_schema() -> Schema:
    schema: Schema = _int_or_string(structural(_durations(msgspec.json.schema(PoolSpecDoc))))
    props = schema["properties"]
    props["template"] = template_schema()
    props["replicas"].update({"minimum": 0, "maximum": MAX_REPLICAS})
    props["recycleOnBlocks"].update({"minimum": 0, "maximum": MAX_BLOCKS})
    props["maxSurge"].update({"minimum": 1, "maximum": MAX_SURGE})
    spread = props["spread"]
    spread["maxItems"] = MAX_SPREAD
    spread["x-kubernetes-list-type"] = "map"
    spread["x-kubernetes-list-map-keys"] = ["provider"]
    entry = spread["items"]["properties"]
    entry["provider"].update({"pattern": "^[A-Za-z0-9_-]{1,63}$", "maxLength": 63})
    entry["weight"].update({"minimum": 1, "maximum": MAX_WEIGHT})
    for name, text in _DESCRIPTIONS.items():
        props[name]["description"] = text
    schema["description"] = "What the pool asks for (docs/pools.md)."
    schema["x-kubernetes-validations"] = copy.deepcopy(_SPEC_RULES)
    return schema


def template_schema() -> Schema:
    """The Proxy spec schema, with the pool's rules instead of a lone Proxy's cross-field
    ones (those about ``external`` stay: a pool refuses External anyway)."""
    schema = spec_schema()
    schema["description"] = _DESCRIPTIONS["template"]
    schema["x-kubernetes-validations"] = copy.deepcopy(_TEMPLATE_RULES)
    schema["properties"]["provider"]["pattern"] = "^[A-Za-z0-9_-]{0,63}$"
    return schema


def proxypool_schema() -> Schema:
    return object_schema(
        "A pool of egress proxies kept at a count, spread over providers and fresh "
        "(docs/pools.md).",
        # Members add six characters and stay DNS labels.
        name={"type": "string", "maxLength": 57, "pattern": "^[a-z0-9]([-a-z0-9]{0,55}[a-z0-9])?$"},
        spec=pool_spec_schema(),
        status=watcher_status(PoolStatus),
    )


POOL_PRINTER_COLUMNS: tuple[Schema, ...] = (
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Members", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.ready"},
    {"name": "Leased", "type": "integer", "jsonPath": ".status.leased"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Healthy", "type": "integer", "jsonPath": ".status.healthy", "priority": 1},
    {"name": "Available", "type": "integer", "jsonPath": ".status.available", "priority": 1},
    {
        "name": "Decision",
        "type": "string",
        "jsonPath": ".status.lastDecision.reason",
        "priority": 1,
    },
)


def proxypool_crd() -> Schema:
    """The CustomResourceDefinition for ``proxypools.crawl.example.com``."""
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return definition(
        kind=KIND,
        plural=PLURAL,
        short_name=SHORT_NAME,
        subresources={"status": {}, "scale": scale},
        columns=POOL_PRINTER_COLUMNS,
        schema=proxypool_schema(),
    )


def render_pool_yaml() -> str:
    """The text of ``deploy/crd/proxypools.yaml``."""
    return render(
        proxypool_crd(),
        "egress-proxies crd --kind ProxyPool > deploy/crd/proxypools.yaml",
    )
