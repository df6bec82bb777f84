"""What every custom resource of ours shares, whichever its kind (Proxy, ProxyPool): the API group
and version, the metadata read, the field-named errors, the check for unknown fields, and the uid
of an object declared without a cluster. Each kind's module (``proxyresource``,
``poolresource``) adds its spec and its rules. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

GROUP = "crawl.example.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# uuid5 namespace for objects declared without a cluster (no apiserver to hand out uids).
CLI_UID_NAMESPACE = uuid.UUID("6f1c1c55-3f55-4a0e-9a55-7a2f3c1d9e01")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
PROVIDER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")
"""A provider instance's name, as the providers config names it (``spec.provider``)."""


class ObjectMeta(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    generation: int = 1
    resource_version: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


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


def unknown_object_fields(obj: Any, spec: mi.Type) -> list[FieldError]:
    """Fields neither the object's envelope, its metadata nor its spec (``spec``) has, each with
    the closest valid name."""
    if not isinstance(obj, dict):
        return []
    errors = unknown_in(obj, TOP_LEVEL, "")
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        errors += unknown_in(meta, OBJECT_META, "metadata.")
    spec_doc = obj.get("spec")
    if isinstance(spec_doc, dict):
        errors += unknown_in_struct(spec_doc, spec, "spec.")
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


def unquote_hint(message: str) -> str:
    """msgspec's message, with the fix when a number was written as a string."""
    if (
        message.startswith("Expected `")
        and message.endswith("got `str`")
        and ("int" in message or "float" in message)
    ):
        return f'{message} (write the number without quotes: 3, not "3")'
    return message


def kind_errors(api_version: str, kind: str, expected: str) -> list[FieldError]:
    """The envelope: our API version, and the kind the reader expects."""
    errors: list[FieldError] = []
    if api_version != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}"))
    if kind != expected:
        errors.append(FieldError("kind", f"must be {expected}"))
    return errors


def namespace_errors(namespace: str) -> list[FieldError]:
    if DNS_LABEL.match(namespace):
        return []
    return [FieldError("metadata.namespace", "use 1-63 lowercase letters, digits or '-'")]
