"""Turning a declared Proxy into ``declared`` events: shared by the CLI and the Kubernetes watcher.

Appends are decided on the folded aggregate with optimistic concurrency, so both sources behave
alike: an unchanged spec appends nothing, a changed one appends a ``ProxySpecChanged``, and two
concurrent writers (two CLI runs, two watchers) cannot both win. Every id derives from the cause
(uid, the sequence folded, the generation and the content), so a retried or duplicated append is
stored once, and a re-declaration after the dedupe window is caught by the fold instead.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from events import subjects
from events.customresource import cli_uid
from events.proxyresource import ProxyResource
from events.schemas import (
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxySpec,
    ProxySpecChanged,
)
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from projections.proxy import fold

POOL_SOURCE = "pool/"
"""How a pool member's ``ProxyDeclared.source`` starts (``pool/<namespace>/<name>``)."""


class OwnedByPool(ValueError):
    """A declaration of a Proxy that a pool's member holds: the pool declares it, and would put
    back anything else declared under its name (docs/decisions/0137-a-pool-member-is-the-pools.md).
    Refused with nothing appended."""

    def __init__(self, namespace: str, name: str, source: str) -> None:
        self.pool = source.removeprefix(POOL_SOURCE)
        super().__init__(
            f"proxy {namespace}/{name} is a member of pool {self.pool}: the pool declares it "
            f"from its template. Change the pool (apply its ProxyPool, or scale it), or give "
            f"your Proxy another name"
        )


@dataclass(frozen=True, slots=True)
class Applied:
    uid: str
    namespace: str
    name: str
    result: str  # created | changed | unchanged | deleting | deleted | absent


@dataclass(frozen=True, slots=True)
class Declaration:
    """One Proxy as a source declares it.

    ``generation`` 0 lets the log count (the CLI has no apiserver to count for it); the watcher
    passes the object's ``metadata.generation`` so ``status.observedGeneration`` means what
    Kubernetes users expect. ``cloud_init`` is the resolved content (inline or from a Secret).
    """

    uid: str
    namespace: str
    name: str
    spec: ProxySpec
    source: str = "cli"
    generation: int = 0
    cloud_init: str = ""


def uid_of(resource: ProxyResource) -> str:
    meta = resource.metadata
    return meta.uid or cli_uid(meta.namespace, meta.name)


def from_resource(resource: ProxyResource) -> Declaration:
    """The CLI's declaration: cloud-init can only be inline without a cluster."""
    meta = resource.metadata
    ci = resource.spec.cloud_init
    return Declaration(
        uid=uid_of(resource),
        namespace=meta.namespace,
        name=meta.name,
        spec=resource.spec,
        cloud_init=ci.inline if ci is not None else "",
    )


def content_hash(spec: ProxySpec, cloud_init: str) -> str:
    """Everything a declaration says (unlike ``spec_hash``, which keeps only what makes the
    instance): two declarations with equal content hashes change nothing."""
    data = msgspec.json.encode([spec, cloud_init], order="sorted")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


async def apply(store: EventStore, declared: ProxyResource | Declaration) -> Applied:
    """Declare (or re-declare) one proxy; a ``ProxyResource`` is the CLI's form. Raises
    ``OwnedByPool``, appending nothing, for a pool's member declared by anyone but its pool."""
    decl = from_resource(declared) if isinstance(declared, ProxyResource) else declared
    uid = decl.uid
    results: list[str] = []
    owner = [""]
    wanted = content_hash(decl.spec, decl.cloud_init)

    def decide(history: History) -> list[NewEvent]:
        view = fold(history.events)
        results.clear()
        if view is None or view.removed:
            generation = decl.generation or ((view.generation + 1) if view is not None else 1)
            results.append("created")
            event = ProxyDeclared(
                uid=uid,
                namespace=decl.namespace,
                name=decl.name,
                spec=decl.spec,
                generation=generation,
                source=decl.source,
                cloud_init_resolved=decl.cloud_init,
            )
            return [NewEvent(event, derive_msg_id(uid, "declared", str(history.last_seq)))]
        if view.source.startswith(POOL_SOURCE) and view.source != decl.source:
            results.append("owned")
            owner[0] = view.source
            return []
        if view.deleting:
            results.append("deleting")
            return []
        same = content_hash(view.spec, view.cloud_init) == wanted
        if same and decl.generation <= view.generation:
            results.append("unchanged")
            return []
        results.append("changed")
        generation = decl.generation if decl.generation > 0 else view.generation + 1
        changed = ProxySpecChanged(
            uid=uid, spec=decl.spec, generation=generation, cloud_init_resolved=decl.cloud_init
        )
        return [NewEvent(changed, derive_msg_id(uid, "spec", str(generation), wanted))]

    await decide_and_append(store, subjects.proxy(uid), decide)
    if results[-1] == "owned":
        raise OwnedByPool(decl.namespace, decl.name, owner[0])
    return Applied(uid, decl.namespace, decl.name, results[-1])


async def delete(store: EventStore, namespace: str, name: str, uid: str = "") -> Applied:
    """Request deletion; the reconciler removes the instance, then appends ``ProxyRemoved``."""
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
