"""Turning what people ask of a pool (apply, scale, delete) into ``declared`` events on its
aggregate (docs/architecture.md, "Pools"), as ``commands.declaring`` does for a Proxy.

Each change is decided on the folded pool with optimistic concurrency, so two writers (two CLI
runs, the CLI and the watcher) cannot both win, and an unchanged spec appends nothing. Every id
derives from the cause (the pool, the sequence folded, the generation and the content), so a
retried append is stored once and a repeat after the dedupe window is caught by the fold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import msgspec

from commands.declaring import Applied
from events import subjects
from events.pool import (
    MAX_REPLICAS,
    PoolDeclared,
    PoolDeletionRequested,
    PoolScaled,
    PoolSpec,
    PoolSpecChanged,
)
from events.poolresource import pool_uid
from events.store import EventStore, History, NewEvent, decide_and_append, derive_msg_id
from projections.pool import PoolView, fold

__all__ = ["Applied", "ReplicasOutOfRange", "apply_pool", "delete_pool", "scale_pool"]


class ReplicasOutOfRange(ValueError):
    """A scale to fewer than 0 or more than ``MAX_REPLICAS`` members: refused before any
    append, so no reader meets a count the fold would have to discard."""


def spec_digest(spec: PoolSpec) -> str:
    data = msgspec.json.encode(spec, order="sorted")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


async def apply_pool(
    store: EventStore, namespace: str, name: str, spec: PoolSpec, source: str = "cli"
) -> Applied:
    """Declare a pool, or change its spec; ``created``, ``changed``, ``unchanged`` or
    ``deleting`` (a pool being deleted is not re-declared until it is removed).

    A spec equal to the pool's leaves a ``scale`` in force, as ``kubectl apply`` leaves a
    ``kubectl scale`` of a field the file did not change."""
    uid = pool_uid(namespace, name)
    results: list[str] = []
    wanted = spec_digest(spec)

    def decide(history: History) -> list[NewEvent]:
        view = fold(list(history.events))
        results.clear()
        if view is None or view.removed:
            results.append("created")
            generation = view.generation + 1 if view is not None else 1
            event = PoolDeclared(
                uid=uid,
                namespace=namespace,
                name=name,
                spec=spec,
                generation=generation,
                source=source,
            )
            msg_id = derive_msg_id(uid, "pool-declared", str(history.last_seq))
            return [NewEvent(event, msg_id)]
        if view.deleting:
            results.append("deleting")
            return []
        if spec_digest(view.spec) == wanted:
            results.append("unchanged")
            return []
        results.append("changed")
        generation = view.generation + 1
        changed = PoolSpecChanged(uid=uid, spec=spec, generation=generation)
        return [NewEvent(changed, derive_msg_id(uid, "pool-spec", str(generation), wanted))]

    await decide_and_append(store, subjects.pool(uid), decide)
    return Applied(uid, namespace, name, results[-1])


async def scale_pool(store: EventStore, namespace: str, name: str, replicas: int) -> Applied:
    """Ask for ``replicas`` members; ``scaled``, ``unchanged``, ``deleting`` or ``absent``.
    Raises ``ReplicasOutOfRange`` before reading anything when the count is out of bounds."""
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ReplicasOutOfRange(
            f"replicas: {replicas} is out of range; use 0 to {MAX_REPLICAS} members"
        )

    def scale(view: PoolView, history: History) -> tuple[str, list[NewEvent]]:
        if view.replicas == replicas:
            return "unchanged", []
        uid = view.uid
        msg_id = derive_msg_id(uid, "pool-scaled", str(history.last_seq), str(replicas))
        return "scaled", [NewEvent(PoolScaled(uid=uid, replicas=replicas), msg_id)]

    return await _standing(store, namespace, name, scale)


async def delete_pool(store: EventStore, namespace: str, name: str) -> Applied:
    """Request a pool's deletion; its controller retires every member, then appends
    ``PoolRemoved``. ``deleted``, ``deleting`` (asked already) or ``absent``."""

    def delete(view: PoolView, history: History) -> tuple[str, list[NewEvent]]:
        msg_id = derive_msg_id(view.uid, "pool-delete", str(history.last_seq))
        return "deleted", [NewEvent(PoolDeletionRequested(uid=view.uid), msg_id)]

    return await _standing(store, namespace, name, delete)


async def _standing(
    store: EventStore,
    namespace: str,
    name: str,
    change: Callable[[PoolView, History], tuple[str, list[NewEvent]]],
) -> Applied:
    """Decide ``change`` on a pool that stands (declared, not being deleted); a pool that does
    not is ``absent`` or ``deleting``, and nothing is appended."""
    uid = pool_uid(namespace, name)
    results: list[str] = []

    def decide(history: History) -> list[NewEvent]:
        view = fold(list(history.events))
        results.clear()
        if view is None or view.removed:
            results.append("absent")
            return []
        if view.deleting:
            results.append("deleting")
            return []
        result, new = change(view, history)
        results.append(result)
        return new

    await decide_and_append(store, subjects.pool(uid), decide)
    return Applied(uid, namespace, name, results[-1])
