"""The Proxy custom resource (``crawl.example.com/v1alpha1``, kind ``Proxy``) as typed structs.

The CLI reads these from YAML and the watcher from the Kubernetes API; both validate here, so a
bad Proxy gets the same field-named error whichever way it arrived. What every custom resource of
ours shares (group, metadata, field errors, the unknown-field check) is ``events.customresource``'s.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any
from urllib.parse import urlparse

import msgspec
import msgspec.inspect as mi

from events.customresource import (
    API_VERSION,
    DNS_LABEL,
    PROVIDER_NAME,
    FieldError,
    ObjectMeta,
    ResourceError,
    kind_errors,
    namespace_errors,
    unknown_object_fields,
    unquote_hint,
)
from events.schemas import ProxyMode, ProxySpec

KIND = "Proxy"
PLURAL = "proxies"
SHORT_NAME = "px"

_ATTR_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?\Z")

MAX_PROBE_INTERVAL = 3600.0
MAX_PROBE_TIMEOUT = 300.0
MAX_THRESHOLD = 1000
MAX_EXPECTED_ASNS = 32
EGRESS_PREFIX = "egress."
"""Selector keys of what was seen of a proxy's egress; no attribute may take them."""
MAX_ASN = 2**32 - 1
_COUNTRY = re.compile(r"^[A-Za-z]{2}\Z")


class ProxyResource(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: ProxySpec = msgspec.field(default_factory=ProxySpec)


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


def unknown_fields(obj: Any) -> list[FieldError]:
    """Fields the Proxy schema does not have, each with the closest valid name.

    A misspelt ``spec.atributes`` would otherwise decode as "no attributes", and the proxy would
    run where no crawler ever selects it; ``kubectl`` refuses the same with strict field
    validation, and so does ``apply`` unless told to only warn.
    """
    return unknown_object_fields(obj, mi.type_info(ProxySpec))


def _from_msgspec(message: str) -> FieldError:
    path = "$"
    if " - at `" in message:
        message, _, rest = message.partition(" - at `")
        path = rest.rstrip("`")
    return FieldError(path, f"{unquote_hint(message)}; see the Proxy schema in deploy/ or docs/")


def validate(resource: ProxyResource) -> list[FieldError]:
    errors = kind_errors(resource.api_version, resource.kind, KIND)
    meta = resource.metadata
    if not DNS_LABEL.match(meta.name):
        errors.append(
            FieldError("metadata.name", "use 1-63 lowercase letters, digits or '-', e.g. de-1")
        )
    errors += namespace_errors(meta.namespace)
    errors.extend(validate_spec(resource.spec))
    return errors


def validate_spec(spec: ProxySpec, prefix: str = "spec") -> list[FieldError]:
    errors: list[FieldError] = []
    if spec.mode is ProxyMode.MANAGED:
        if not PROVIDER_NAME.match(spec.provider):
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
