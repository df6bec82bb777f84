"""The ProxyPool custom resource (``crawl.example.com/v1alpha1``, kind ``ProxyPool``) as typed
structs, validated before anything reaches the log.

The manifest says durations as people write them (``maxAge: 6h``); the ``PoolSpec`` appended
holds seconds, finite and bounded, so no reader meets a value it cannot use. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import msgspec

from events.customresource import (
    API_VERSION,
    DNS_LABEL,
    PROVIDER_NAME,
    FieldError,
    ObjectMeta,
    ResourceError,
    cli_uid,
    kind_errors,
    namespace_errors,
    unknown_in,
    unknown_object_fields,
    unquote_hint,
)
from events.durations import EXAMPLES, parse_duration
from events.pool import (
    MAX_AGE_SECONDS,
    MAX_AUTOSCALE_WAIT_SECONDS,
    MAX_BLOCKS,
    MAX_REPLICAS,
    MAX_SPREAD,
    MAX_SURGE,
    MAX_WEIGHT,
    MIN_AGE_SECONDS,
    Autoscale,
    PoolSpec,
    SpreadEntry,
)
from events.proxyresource import validate_spec
from events.spec import ProxyMode, ProxySpec

KIND = "ProxyPool"
PLURAL = "proxypools"
SHORT_NAME = "ppl"
POOL_ATTRIBUTE = "pool"
"""The attribute (and, on Kubernetes, the label) every member carries: the pool's name, so
``get -l pool=de`` and a lease selector ``{"pool": "de"}`` find the members."""

MAX_POOL_NAME = 57
"""A member is ``<pool>-<5 characters>``, a DNS label of at most 63."""
SUFFIX_LENGTH = 5
_SPREAD_FIELDS = frozenset(f.encode_name for f in msgspec.structs.fields(SpreadEntry))
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""Member suffixes as Kubernetes' generateName makes them: no vowels, so no words."""


class AutoscaleDoc(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """``spec.autoscale`` as written (docs/pools.md, "Autoscale")."""

    min: int = 1
    max: int = 10
    target_leased: float = 0.8
    scale_up_after: str | float = "30s"
    scale_down_after: str | float = "10m"


class PoolSpecDoc(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """The spec as written; ``to_spec`` turns it into the ``PoolSpec`` the log keeps."""

    replicas: int = 0
    template: ProxySpec = msgspec.field(default_factory=ProxySpec)
    spread: list[SpreadEntry] = msgspec.field(default_factory=list)
    max_age: str | float = 0
    recycle_on_blocks: int = 0
    max_surge: int = 1
    autoscale: AutoscaleDoc | None = None


class PoolResource(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PoolSpecDoc = msgspec.field(default_factory=PoolSpecDoc)


def pool_uid(namespace: str, name: str) -> str:
    """A pool declared without a cluster: stable per namespace/name (like a Proxy's); the
    ``pool:`` prefix keeps it apart from a Proxy of the same name."""
    return cli_uid(namespace, f"pool:{name}")


def member_name(pool: str, pool_uid_: str, ordinal: int) -> str:
    """The member's name: the pool's, then 5 characters derived from the pool's uid and the
    member's ordinal, so two replicas deciding the same member name it alike, and a member
    re-planned after a crash is the same Proxy."""
    digest = hashlib.blake2b(f"{pool_uid_}/{ordinal}".encode(), digest_size=8).digest()
    number = int.from_bytes(digest, "big")
    chars = []
    for _ in range(SUFFIX_LENGTH):
        number, index = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[index])
    return f"{pool}-{''.join(chars)}"


def unknown_pool_fields(obj: Any) -> list[FieldError]:
    """Fields the ProxyPool schema does not have, each with the closest valid name."""
    errors = unknown_object_fields(obj, msgspec.inspect.type_info(PoolSpecDoc))
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if isinstance(spec, dict):
        spread = spec.get("spread")
        if isinstance(spread, list):
            # A list of structs is not looked into by unknown_in_struct: a misspelt ``wieght``
            # would leave the weight 1.
            for index, entry in enumerate(spread):
                if isinstance(entry, dict):
                    errors += unknown_in(entry, _SPREAD_FIELDS, f"spec.spread[{index}].")
    return errors


def from_object(obj: Any, source: str = "proxypool") -> tuple[PoolResource, PoolSpec]:
    """Convert a decoded YAML/JSON object, validate it and give the spec the log keeps.
    Strictly: ``replicas: "3"`` is refused naming the field (docs/decisions/0137-a-pool-member-
    is-the-pools.md), on the CLI's path and the watcher's alike."""
    if not isinstance(obj, dict):
        raise ResourceError(source, [FieldError("$", "expected a mapping (a ProxyPool object)")])
    try:
        resource = msgspec.convert(obj, PoolResource, strict=True)
    except msgspec.ValidationError as exc:
        message, _, path = str(exc).partition(" - at `")
        where = path.rstrip("`") or "$"
        if where.startswith("key` in `"):  # a mapping with a key that is no string
            where = where.removeprefix("key` in `")
            message = f"keys must be strings ({message})"
        raise ResourceError(
            source,
            [
                FieldError(
                    where, f"{unquote_hint(message)}; see the ProxyPool schema in docs/pools.md"
                )
            ],
        ) from exc
    errors, spec = validate(resource)
    if errors or spec is None:
        raise ResourceError(source, errors)
    return resource, spec


def validate(resource: PoolResource) -> tuple[list[FieldError], PoolSpec | None]:
    errors = kind_errors(resource.api_version, resource.kind, KIND)
    meta = resource.metadata
    if not DNS_LABEL.match(meta.name) or len(meta.name) > MAX_POOL_NAME:
        errors.append(
            FieldError(
                "metadata.name",
                f"use 1-{MAX_POOL_NAME} lowercase letters, digits or '-' (members add 6), e.g. de",
            )
        )
    errors += namespace_errors(meta.namespace)
    doc = resource.spec
    errors += _counts(doc)
    template = doc.template
    if POOL_ATTRIBUTE in template.attributes:
        errors.append(
            FieldError(
                f"spec.template.attributes.{POOL_ATTRIBUTE}",
                "set by the pool on every member (its name); remove it",
            )
        )
    errors += _template(doc)
    max_age = _max_age(doc.max_age, errors)
    autoscale = _autoscale(doc.autoscale, errors)
    if errors:
        return errors, None
    return [], PoolSpec(
        replicas=doc.replicas,
        template=template,
        spread=tuple(doc.spread),
        max_age_seconds=max_age,
        recycle_on_blocks=doc.recycle_on_blocks,
        max_surge=doc.max_surge,
        autoscale=autoscale,
    )


def _counts(doc: PoolSpecDoc) -> list[FieldError]:
    errors = []
    for name, value, low, high in (
        ("replicas", doc.replicas, 0, MAX_REPLICAS),
        ("recycleOnBlocks", doc.recycle_on_blocks, 0, MAX_BLOCKS),
        ("maxSurge", doc.max_surge, 1, MAX_SURGE),
    ):
        if not low <= value <= high:
            errors.append(FieldError(f"spec.{name}", f"must be from {low} to {high}"))
    return errors


def _template(doc: PoolSpecDoc) -> list[FieldError]:
    """The template is a Proxy spec; with ``spread`` its provider comes from the spread."""
    errors = []
    if len(doc.spread) > MAX_SPREAD:
        errors.append(FieldError("spec.spread", f"at most {MAX_SPREAD} entries"))
    seen: set[str] = set()
    for index, entry in enumerate(doc.spread):
        where = f"spec.spread[{index}]"
        if not PROVIDER_NAME.match(entry.provider):
            errors.append(
                FieldError(
                    f"{where}.provider",
                    "the name of a provider instance from --providers-config (1-63 letters, "
                    "digits, '_' or '-'), e.g. local",
                )
            )
        elif entry.provider in seen:
            errors.append(FieldError(f"{where}.provider", f"{entry.provider} is listed twice"))
        seen.add(entry.provider)
        if not 1 <= entry.weight <= MAX_WEIGHT:
            errors.append(FieldError(f"{where}.weight", f"must be from 1 to {MAX_WEIGHT}"))
    template = doc.template
    if template.mode is not ProxyMode.MANAGED:
        errors.append(
            FieldError(
                "spec.template.mode",
                "a pool runs Managed proxies on its providers; remove it (declare an External "
                "proxy on its own, kind Proxy)",
            )
        )
        # The rest of the template held to a Managed proxy's rules.
        template = msgspec.structs.replace(template, mode=ProxyMode.MANAGED)
    if doc.spread:
        if template.provider:
            errors.append(
                FieldError(
                    "spec.template.provider",
                    "the spread names the providers; remove it or the spread",
                )
            )
        # Checked with a provider filled in, so the rest of the template is held to the rules
        # (a valid one: the spread's own errors are named above, not as the template's).
        template = msgspec.structs.replace(template, provider="spread")
    if template.cloud_init is not None and template.cloud_init.secret_ref is not None:
        errors.append(
            FieldError(
                "spec.template.cloudInit.secretRef",
                "not yet for pools; put the cloud-init in spec.template.cloudInit.inline",
            )
        )
    return errors + validate_spec(template, "spec.template")


def _max_age(value: str | float, errors: list[FieldError]) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        errors.append(FieldError("spec.maxAge", str(exc)))
        return 0.0
    if seconds != 0 and not MIN_AGE_SECONDS <= seconds <= MAX_AGE_SECONDS:
        errors.append(FieldError("spec.maxAge", f"0 (never), or from 10s to 8760h; {EXAMPLES}"))
    return seconds if math.isfinite(seconds) else 0.0


def _autoscale(doc: AutoscaleDoc | None, errors: list[FieldError]) -> Autoscale | None:
    if doc is None:
        return None
    where = "spec.autoscale"
    before = len(errors)
    if not 0 <= doc.min <= MAX_REPLICAS:
        errors.append(FieldError(f"{where}.min", f"must be from 0 to {MAX_REPLICAS}"))
    if not 1 <= doc.max <= MAX_REPLICAS:
        errors.append(FieldError(f"{where}.max", f"must be from 1 to {MAX_REPLICAS}"))
    elif doc.min > doc.max:
        errors.append(FieldError(f"{where}.max", f"must be at least min ({doc.min})"))
    target = doc.target_leased
    if not (math.isfinite(target) and 0 < target <= 1):
        errors.append(
            FieldError(
                f"{where}.targetLeased",
                "the share of healthy members the pool aims to have leased: above 0, at most 1 "
                "(e.g. 0.8)",
            )
        )
    waits = []
    for name, value in (
        ("scaleUpAfter", doc.scale_up_after),
        ("scaleDownAfter", doc.scale_down_after),
    ):
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            errors.append(FieldError(f"{where}.{name}", str(exc)))
            seconds = 0.0
        if seconds > MAX_AUTOSCALE_WAIT_SECONDS:
            errors.append(FieldError(f"{where}.{name}", f"at most 168h; {EXAMPLES}"))
        waits.append(seconds)
    if len(errors) > before:
        return None
    return Autoscale(
        min=doc.min,
        max=doc.max,
        target_leased=float(target),
        scale_up_after_seconds=waits[0],
        scale_down_after_seconds=waits[1],
    )
