"""The Proxy custom resource (``crawl.example.com/v1alpha1``, kind ``Proxy``) as typed structs.

The CLI reads these from YAML and the watcher from the Kubernetes API; both validate here, so a
bad Proxy gets the same field-named error whichever way it arrived. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import msgspec
import msgspec.inspect as mi

from events.schemas import ProxyMode, ProxySpec

GROUP = "crawl.example.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Proxy"
PLURAL = "proxies"
SHORT_NAME = "px"

# uuid5 namespace for proxies declared without a cluster (no apiserver to hand out uids).
CLI_UID_NAMESPACE = uuid.UUID("6f1c1c55-3f55-4a0e-9a55-7a2f3c1d9e01")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_ATTR_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?\Z")
_PROVIDER = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")

MAX_PROBE_INTERVAL = 3600.0
MAX_PROBE_TIMEOUT = 300.0
MAX_THRESHOLD = 1000
MAX_EXPECTED_ASNS = 32
EGRESS_PREFIX = "egress."
"""Selector keys of what was seen of a proxy's egress; no attribute may take them."""
MAX_ASN = 2**32 - 1
_COUNTRY = re.compile(r"^[A-Za-z]{2}\Z")


class ObjectMeta(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    generation: int = 1
    resource_version: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class ProxyResource(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ProxySpec = msgspec.field(default_factory=ProxySpec)


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ResourceError(ValueError):
    """One or more fields are invalid; each error names its field and the fix."""

    def __init__(self, source: str, errors: Iterable[FieldError]) -> None:
        self.source = source
        self.errors = list(errors)
        super().__init__(f"{source}: " + "; ".join(str(e) for e in self.errors))


def cli_uid(namespace: str, name: str) -> str:
    """A uid for a Proxy declared without a cluster: stable per namespace/name, so a re-apply
    finds the same aggregate and two concurrent applies meet at its optimistic concurrency."""
    return str(uuid.uuid5(CLI_UID_NAMESPACE, f"{namespace}/{name}"))


def from_object(obj: Any, source: str = "proxy") -> ProxyResource:
    """Convert a decoded YAML/JSON object, then validate it. Strictly: a number written as a
    string (``failureThreshold: "3"``) is refused naming the field, as the API and the CRD's
    schema refuse it, rather than taken for one on this path alone
    (docs/decisions/0137-a-pool-member-is-the-pools.md)."""
    if not isinstance(obj, dict):
        raise ResourceError(source, [FieldError("$", "expected a mapping (a Proxy object)")])
    try:
        resource = msgspec.convert(obj, ProxyResource, strict=True)
    except msgspec.ValidationError as exc:
        raise ResourceError(source, [_from_msgspec(str(exc))]) from exc
    errors = validate(resource)
    if errors:
        raise ResourceError(source, errors)
    return resource


# Kubernetes ObjectMeta fields a manifest may carry (e.g. one saved with `kubectl get -o yaml`):
# known, so not "unknown", though only name, namespace, labels and annotations matter here.
OBJECT_META = frozenset(
    {
        "annotations",
        "creationTimestamp",
        "deletionGracePeriodSeconds",
        "deletionTimestamp",
        "finalizers",
        "generateName",
        "generation",
        "labels",
        "managedFields",
        "name",
        "namespace",
        "ownerReferences",
        "resourceVersion",
        "selfLink",
        "uid",
    }
)
TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})


def unknown_fields(obj: Any) -> list[FieldError]:
    """Fields the Proxy schema does not have, each with the closest valid name.

    A misspelt ``spec.atributes`` would otherwise decode as "no attributes", and the proxy would
    run where no crawler ever selects it; ``kubectl`` refuses the same with strict field
    validation, and so does ``apply`` unless told to only warn.
    """
    if not isinstance(obj, dict):
        return []
    errors = unknown_in(obj, TOP_LEVEL, "")
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        errors += unknown_in(meta, OBJECT_META, "metadata.")
    spec = obj.get("spec")
    if isinstance(spec, dict):
        errors += unknown_in_struct(spec, mi.type_info(ProxySpec), "spec.")
    return errors


def unknown_in(obj: dict[Any, Any], known: frozenset[str], prefix: str) -> list[FieldError]:
    errors = []
    for key in obj:
        if isinstance(key, str) and key in known:
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        names = ", ".join(sorted(known))
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known: {names}"
        errors.append(FieldError(f"{prefix}{key}", f"unknown field; {hint}"))
    return errors


def unknown_in_struct(obj: dict[Any, Any], info: mi.Type, prefix: str) -> list[FieldError]:
    struct = _struct_of(info)
    if struct is None:
        return []
    fields = {f.encode_name: f for f in struct.fields}
    errors = unknown_in(obj, frozenset(fields), prefix)
    for name, field in fields.items():
        value = obj.get(name)
        if isinstance(value, dict) and _struct_of(field.type) is not None:
            errors += unknown_in_struct(value, field.type, f"{prefix}{name}.")
    return errors


def _struct_of(info: mi.Type) -> mi.StructType | None:
    if isinstance(info, mi.StructType):
        return info
    if isinstance(info, mi.UnionType):
        return next((t for t in info.types if isinstance(t, mi.StructType)), None)
    return None


def _from_msgspec(message: str) -> FieldError:
    path = "$"
    if " - at `" in message:
        message, _, rest = message.partition(" - at `")
        path = rest.rstrip("`")
    return FieldError(path, f"{unquote_hint(message)}; see the Proxy schema in deploy/ or docs/")


def unquote_hint(message: str) -> str:
    """msgspec's message, with the fix when a number was written as a string."""
    if (
        message.startswith("Expected `")
        and message.endswith("got `str`")
        and ("int" in message or "float" in message)
    ):
        return f'{message} (write the number without quotes: 3, not "3")'
    return message


def validate(resource: ProxyResource) -> list[FieldError]:
    errors: list[FieldError] = []
    if resource.api_version != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}"))
    if resource.kind != KIND:
        errors.append(FieldError("kind", f"must be {KIND}"))
    meta = resource.metadata
    if not _DNS_LABEL.match(meta.name):
        errors.append(
            FieldError("metadata.name", "use 1-63 lowercase letters, digits or '-', e.g. de-1")
        )
    if not _DNS_LABEL.match(meta.namespace):
        errors.append(FieldError("metadata.namespace", "use 1-63 lowercase letters, digits or '-'"))
    errors.extend(validate_spec(resource.spec))
    return errors


def validate_spec(spec: ProxySpec, prefix: str = "spec") -> list[FieldError]:
    errors: list[FieldError] = []
    if spec.mode is ProxyMode.MANAGED:
        if not _PROVIDER.match(spec.provider):
            errors.append(
                FieldError(
                    f"{prefix}.provider",
                    "required for mode Managed: the name of a provider instance from "
                    "--providers-config (e.g. local)",
                )
            )
        if spec.external is not None and spec.external.url:
            errors.append(FieldError(f"{prefix}.external.url", "only for mode External; remove it"))
    else:
        url = spec.external.url if spec.external is not None else ""
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https", "socks5", "socks5h") or not parsed.hostname:
            errors.append(
                FieldError(
                    f"{prefix}.external.url",
                    "required for mode External: a proxy URL such as http://10.0.0.5:3128",
                )
            )
    hc = spec.health_check
    hcp = f"{prefix}.healthCheck"
    # Finite bounds: the spec goes into the immutable log, and a value no reader can use (an
    # infinity encodes as null) would be there for ever.
    for name, seconds, high in (
        ("intervalSeconds", hc.interval_seconds, MAX_PROBE_INTERVAL),
        ("timeoutSeconds", hc.timeout_seconds, MAX_PROBE_TIMEOUT),
    ):
        if not (math.isfinite(seconds) and 0 < seconds <= high):
            errors.append(FieldError(f"{hcp}.{name}", f"must be more than 0 and at most {high:g}"))
    for name, count in (
        ("failureThreshold", hc.failure_threshold),
        ("successThreshold", hc.success_threshold),
    ):
        if not 1 <= count <= MAX_THRESHOLD:
            errors.append(FieldError(f"{hcp}.{name}", f"must be from 1 to {MAX_THRESHOLD}"))
    if hc.url and urlparse(hc.url).scheme not in ("http", "https"):
        errors.append(FieldError(f"{prefix}.healthCheck.url", "must be an http:// or https:// URL"))
    for key, value in spec.attributes.items():
        if key.startswith(EGRESS_PREFIX):
            errors.append(
                FieldError(
                    f"{prefix}.attributes.{key}",
                    f"keys starting {EGRESS_PREFIX!r} name what was seen of the egress "
                    "(egress.country, egress.asn); rename the attribute",
                )
            )
        elif not _ATTR_KEY.match(key):
            errors.append(
                FieldError(
                    f"{prefix}.attributes.{key}",
                    "keys are 1-63 letters, digits, '.', '_', '/' or '-'",
                )
            )
        if len(value) > 256:
            errors.append(FieldError(f"{prefix}.attributes.{key}", "values are at most 256 chars"))
    errors.extend(validate_egress(spec, prefix))
    ci = spec.cloud_init
    if ci is not None and ci.inline and ci.secret_ref is not None:
        errors.append(FieldError(f"{prefix}.cloudInit", "set either inline or secretRef, not both"))
    return errors


def validate_egress(spec: ProxySpec, prefix: str = "spec") -> list[FieldError]:
    """``spec.egress`` and ``spec.egressCheck``: strict, as everything bound for the log is."""
    errors: list[FieldError] = []
    expect = spec.egress_rules.expect
    if expect.country and not _COUNTRY.match(expect.country):
        errors.append(
            FieldError(
                f"{prefix}.egress.expect.country",
                "an ISO 3166 alpha-2 country code of two letters, e.g. de",
            )
        )
    if len(expect.asn) > MAX_EXPECTED_ASNS:
        errors.append(
            FieldError(f"{prefix}.egress.expect.asn", f"at most {MAX_EXPECTED_ASNS} numbers")
        )
    for i, number in enumerate(expect.asn):
        if not 1 <= number <= MAX_ASN:
            errors.append(
                FieldError(
                    f"{prefix}.egress.expect.asn[{i}]",
                    f"an autonomous system number from 1 to {MAX_ASN} (3320, not AS3320)",
                )
            )
    url = spec.egress_url
    if url and (urlparse(url).scheme not in ("http", "https") or not urlparse(url).hostname):
        errors.append(FieldError(f"{prefix}.egressCheck.url", "must be an http:// or https:// URL"))
    return errors


def spec_hash(spec: ProxySpec, cloud_init: str = "") -> str:
    """What makes an instance what it is. Attributes and the health check are left out: they
    change how the proxy is chosen and probed, not the machine, so changing them replaces nothing.
    """
    relevant = {
        "mode": spec.mode,
        "provider": spec.provider,
        "placement": spec.placement,
        "external": spec.external,
        "cloudInit": spec.cloud_init,
        "cloudInitResolved": cloud_init,
    }
    data = msgspec.json.encode(relevant, order="sorted")
    return hashlib.sha256(data).hexdigest()[:16]
