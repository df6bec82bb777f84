"""What the watcher reads from the cluster, as plain values: a Proxy object and its cloud-init.

Pure: the API layer hands raw dicts in, and everything the watcher decides from them is decided
here, so the rules (what counts as deleting, which Secret is acceptable, what a rotation is) are
tested without a server.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import msgspec

from events.customresource import unquote_hint
from events.proxyresource import ProxyResource
from events.schemas import ProxySpec
from services.watcher.pure.crdschema import FINALIZER
from services.watcher.pure.proxycrd import CLOUD_INIT_LABEL

__all__ = [
    "CLOUD_INIT_LABEL",
    "FINALIZER",
    "SOURCE",
    "KubeObject",
    "Problem",
    "ProxyObject",
    "metadata",
    "parse_proxy",
]

SOURCE = "kubernetes"


@dataclass(frozen=True, slots=True)
class Problem:
    """Why a declaration cannot be acted on; shown as a condition, never appended to the log
    (the cluster holds the cause, so a new leader finds it again at its first listing)."""

    condition: str  # CloudInitError | InvalidSpec
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class KubeObject:
    """What the watcher reads from any object's metadata (a Proxy, a ProxyPool)."""

    uid: str
    namespace: str
    name: str
    generation: int = 1
    resource_version: str = ""
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def has_finalizer(self) -> bool:
        return FINALIZER in self.finalizers


class Metadata(TypedDict):
    uid: str
    namespace: str
    name: str
    generation: int
    resource_version: str
    deleting: bool
    finalizers: tuple[str, ...]
    status: dict[str, Any]


def metadata(raw: Mapping[str, Any]) -> Metadata:
    """The ``KubeObject`` fields of an object as the API returned it; what is missing or
    malformed reads as an object that has none (the apiserver always sends them)."""
    meta = raw.get("metadata") or {}
    if not isinstance(meta, Mapping):
        meta = {}
    generation = meta.get("generation")
    status = raw.get("status")
    return Metadata(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        generation=generation if isinstance(generation, int) and generation > 0 else 1,
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
        status=dict(status) if isinstance(status, Mapping) else {},
    )


@dataclass(frozen=True, slots=True)
class ProxyObject(KubeObject):
    spec: ProxySpec | None = None
    invalid: Problem | None = None

    @property
    def secret_name(self) -> str:
        ci = self.spec.cloud_init if self.spec is not None else None
        return ci.secret_ref.name if ci is not None and ci.secret_ref is not None else ""


def parse_proxy(raw: Mapping[str, Any]) -> ProxyObject:
    """A Proxy as the API returned it; a spec that does not even convert is kept as a problem."""
    spec: ProxySpec | None = None
    invalid: Problem | None = None
    try:
        resource = msgspec.convert(
            {"metadata": {}, "spec": raw.get("spec") or {}}, ProxyResource, strict=True
        )
        spec = resource.spec
    except msgspec.ValidationError as exc:
        message, _, path = str(exc).partition(" - at `$.")
        where = path.rstrip("`") or "spec"
        invalid = Problem(
            "InvalidSpec",
            "InvalidSpec",
            f"{where}: {unquote_hint(message)}; see the Proxy CRD's schema",
        )
    return ProxyObject(**metadata(raw), spec=spec, invalid=invalid)


def finalizers_with(obj: KubeObject) -> list[str]:
    return [*obj.finalizers, FINALIZER] if not obj.has_finalizer else list(obj.finalizers)


def finalizers_without(obj: KubeObject) -> list[str]:
    return [f for f in obj.finalizers if f != FINALIZER]


def resolve_cloud_init(obj: ProxyObject, secret: dict[str, Any] | None) -> str | Problem:
    """The cloud-init an instance of ``obj`` is built with, or why there is none.

    Only a Secret labelled ``crawl.example.com/cloud-init: "true"`` is read: the label is the
    owner's consent that the watcher (which may read Secrets cluster-wide) use it as cloud-init.
    """
    spec = obj.spec
    ci = spec.cloud_init if spec is not None else None
    if ci is None:
        return ""
    if ci.secret_ref is None:
        return ci.inline
    ref = ci.secret_ref
    where = f"Secret {obj.namespace}/{ref.name}"
    if secret is None:
        return Problem(
            "CloudInitError",
            "SecretNotFound",
            f"{where} (spec.cloudInit.secretRef) does not exist; create it in the Proxy's "
            f'namespace with the label {CLOUD_INIT_LABEL}: "true"',
        )
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(CLOUD_INIT_LABEL) != "true":
        return Problem(
            "CloudInitError",
            "SecretNotLabelled",
            f'{where} lacks the label {CLOUD_INIT_LABEL}: "true"; label it to allow its use '
            f"as cloud-init (kubectl label secret -n {obj.namespace} {ref.name} "
            f"{CLOUD_INIT_LABEL}=true)",
        )
    string_data = secret.get("stringData") or {}
    if ref.key in string_data:
        return str(string_data[ref.key])
    data = secret.get("data") or {}
    if ref.key not in data:
        return Problem(
            "CloudInitError",
            "SecretKeyMissing",
            f"{where} has no key {ref.key!r} (spec.cloudInit.secretRef.key); "
            f"keys: {', '.join(sorted(data)) or 'none'}",
        )
    try:
        return base64.b64decode(str(data[ref.key]), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        return Problem(
            "CloudInitError",
            "SecretUnreadable",
            f"{where} key {ref.key!r} is not base64-encoded UTF-8 text ({exc})",
        )
