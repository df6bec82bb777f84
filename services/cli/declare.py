"""Declaring proxies without a cluster: the CLI as a second source of ``declared`` events.

Appends are decided on the folded aggregate with optimistic concurrency, exactly as the watcher
does for custom resources: an unchanged spec appends nothing, a changed one appends a
``ProxySpecChanged`` with the next generation, and two concurrent applies cannot both win.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import yaml

from events import subjects
from events.resource import FieldError, ProxyResource, ResourceError, cli_uid, from_object
from events.schemas import ProxyDeclared, ProxyDeletionRequested, ProxySpecChanged
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from projections.proxy import ProxyView, fold


@dataclass(frozen=True, slots=True)
class Applied:
    uid: str
    namespace: str
    name: str
    result: str  # created | changed | unchanged | deleting | absent


def load_resources(path: Path) -> list[ProxyResource]:
    """Every Proxy document in a YAML file (``-`` reads standard input upstream)."""
    text = path.read_text()
    return parse_resources(text, str(path))


def parse_resources(text: str, source: str) -> list[ProxyResource]:
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ResourceError(source, [FieldError("$", f"not valid YAML: {exc}")]) from exc
    resources: list[ProxyResource] = []
    errors: list[str] = []
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})"
        try:
            resource = from_object(document, where)
        except ResourceError as exc:
            errors.append(str(exc))
            continue
        ci = resource.spec.cloud_init
        if ci is not None and ci.secret_ref is not None:
            errors.append(
                f"{where}: spec.cloudInit.secretRef: Secrets exist only in a cluster; "
                "without one, put the cloud-init in spec.cloudInit.inline"
            )
            continue
        resources.append(resource)
    if errors:
        # All or nothing: a file half-applied is harder to reason about than one refused.
        raise ResourceError(source, [FieldError("$", "\n  ".join(errors))])
    return resources


def uid_of(resource: ProxyResource) -> str:
    meta = resource.metadata
    return meta.uid or cli_uid(meta.namespace, meta.name)


async def apply(store: EventStore, resource: ProxyResource) -> Applied:
    uid = uid_of(resource)
    meta = resource.metadata
    results: list[str] = []
    cloud_init = resource.spec.cloud_init.inline if resource.spec.cloud_init else ""

    def decide(history: History) -> list[NewEvent]:
        view = fold(history.events)
        results.clear()
        if view is None or view.removed:
            generation = (view.generation + 1) if view is not None else 1
            results.append("created")
            event = ProxyDeclared(
                uid=uid,
                namespace=meta.namespace,
                name=meta.name,
                spec=resource.spec,
                generation=generation,
                source="cli",
                cloud_init_resolved=cloud_init,
            )
            return [NewEvent(event, derive_msg_id(uid, "declared", str(history.last_seq)))]
        if view.deleting:
            results.append("deleting")
            return []
        if _same_spec(view, resource):
            results.append("unchanged")
            return []
        results.append("changed")
        changed = ProxySpecChanged(
            uid=uid,
            spec=resource.spec,
            generation=view.generation + 1,
            cloud_init_resolved=cloud_init,
        )
        return [NewEvent(changed, derive_msg_id(uid, "spec", str(view.generation + 1)))]

    await decide_and_append(store, subjects.proxy(uid), decide)
    return Applied(uid, meta.namespace, meta.name, results[-1])


def _same_spec(view: ProxyView, resource: ProxyResource) -> bool:
    return msgspec.json.encode(view.spec, order="sorted") == msgspec.json.encode(
        resource.spec, order="sorted"
    )


async def delete(store: EventStore, namespace: str, name: str, uid: str = "") -> Applied:
    uid = uid or cli_uid(namespace, name)
    results: list[str] = []

    def decide(history: History) -> list[NewEvent]:
        view = fold(history.events)
        results.clear()
        if view is None or view.removed:
            results.append("absent")
            return []
        if view.deleting:
            results.append("deleting")
            return []
        results.append("deleted")
        event = ProxyDeletionRequested(uid=uid)
        return [NewEvent(event, derive_msg_id(uid, "delete", str(history.last_seq)))]

    await decide_and_append(store, subjects.proxy(uid), decide)
    return Applied(uid, namespace, name, results[-1])


def targets(resources: Iterable[ProxyResource]) -> list[tuple[str, str, str]]:
    return [(r.metadata.namespace, r.metadata.name, uid_of(r)) for r in resources]
