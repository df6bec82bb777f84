"""The Proxy objects that show a pool's members on Kubernetes (``kubectl get px -l pool=de``).

A member is a Proxy in the log, declared by the pool controller; its *mirror* is a Proxy object
of the same name, labelled ``pool=<name>``, owned by the ProxyPool object and annotated with the
member's uid (docs/pools.md, "On Kubernetes"). The mirror is never declared as a Proxy of its
own: ``ProxySync`` hands every mirror it sees here. Level-triggered, on each ``keep``:

- an active member whose Proxy the log holds gets a mirror, created with the member's spec;
- a mirror that differs (edited by hand) is put back;
- a mirror no active member wants (retired, or its pool is gone) is deleted;
- a mirror deleted by hand, whose member the pool still wants, forces the member's replacement
  (``RotationRequested``: a fresh instance, make-before-break, the name kept) and is created
  again (docs/decisions, "a mirror deleted by hand").

Statuses are the status writer's: it finds a member's mirror on the board by the member's uid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from commands.rotating import request_rotation
from events.store import EventStore
from projections.proxy import ProxyView
from services.watcher.board import Board
from services.watcher.customobjects import Raw
from services.watcher.poolkube import PoolApi
from services.watcher.pure.objects import parse_proxy
from services.watcher.pure.pools import PoolObject, is_mirror, mirror, mirror_member, mirror_patch

log = structlog.get_logger("egress.watcher.mirrors")
Key = tuple[str, str]
"""(namespace, name) of a Proxy object."""
REQUESTER = "kubernetes"


@dataclass(frozen=True, slots=True)
class Wanted:
    pool: PoolObject
    member_uid: str
    body: dict[str, Any]
    create: bool
    """False while its pool is being deleted: shown until retired, never made again."""


def _key(raw: Mapping[str, Any]) -> Key:
    meta = raw.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _uid(raw: Mapping[str, Any]) -> str:
    return str((raw.get("metadata") or {}).get("uid") or "")


class Mirrors:
    def __init__(self, store: EventStore, api: PoolApi, board: Board) -> None:
        self.store = store
        self.api = api
        self.board = board
        self.seen: dict[Key, Raw] = {}
        """Mirror objects in the cluster, by namespace and name."""
        self.uids: set[str] = set()
        """Object uids of every mirror seen or made: a mirror stripped of its marks by hand
        is still known as one, and put back."""
        self.ours: set[str] = set()
        """Mirrors we deleted: their DELETED event is no hand deletion."""
        self.wanted: dict[Key, Wanted] = {}
        self.replaced = 0
        """Members replaced because their mirror was deleted by hand."""

    # ------------------------------------------------------------------ what ProxySync hands in

    def claims(self, raw: Mapping[str, Any]) -> bool:
        return is_mirror(raw) or _uid(raw) in self.uids

    def listed(self, raws: Iterable[Raw]) -> None:
        """A full listing of the Proxy objects that are mirrors."""
        self.seen = {_key(raw): raw for raw in raws}
        self.uids |= {_uid(raw) for raw in self.seen.values()}
        for key in self.seen:
            self._show(key)

    def observed(self, raw: Raw) -> None:
        key = _key(raw)
        self.seen[key] = raw
        self.uids.add(_uid(raw))
        self._show(key)

    async def gone(self, raw: Raw) -> None:
        key, uid = _key(raw), _uid(raw)
        if _uid(self.seen.get(key) or {}) == uid:
            del self.seen[key]
        self.uids.discard(uid)
        wanted = self.wanted.get(key)
        if wanted is not None:
            self.board.mirrors.pop(wanted.member_uid, None)
        if uid in self.ours:
            self.ours.discard(uid)
            return
        if wanted is None or not wanted.create:
            return  # its member retired, or its pool going: nothing to replace
        log.info("mirror deleted by hand; replacing its member", namespace=key[0], name=key[1])
        if await self.rotate(wanted.member_uid):
            self.replaced += 1

    def _show(self, key: Key) -> None:
        """Let the status writer find the mirror by its member's uid."""
        wanted, raw = self.wanted.get(key), self.seen.get(key)
        if wanted is None or raw is None:
            return
        self.board.mirrors[wanted.member_uid] = parse_proxy(raw)
        self.board.mark(wanted.member_uid)

    # ------------------------------------------------------------------ one pass

    def want(
        self,
        pools: Iterable[tuple[PoolObject, list[tuple[str, str]]]],
        proxies: Mapping[str, ProxyView],
    ) -> None:
        """What mirrors should exist: ``pools`` is each pool object with its active members
        (name, uid) as the log holds them; a member gets a mirror once its Proxy is declared."""
        wanted: dict[Key, Wanted] = {}
        for pool, members in pools:
            for name, uid in members:
                proxy = proxies.get(uid)
                if proxy is None or proxy.removed or not proxy.name:
                    continue
                body = mirror(pool, name, uid, proxy.spec)
                create = not pool.deleting
                wanted[(pool.namespace, name)] = Wanted(pool, uid, body, create)
        self.wanted = wanted
        shown = {w.member_uid for w in wanted.values()}
        for uid in [u for u in self.board.mirrors if u not in shown]:
            del self.board.mirrors[uid]
        for key in self.seen:
            self._show(key)

    async def keep(self, complete: bool) -> None:
        """Create, put back and delete mirrors as ``want`` decided. ``complete``: the pools
        and Proxies have been listed, so a mirror nobody wants is stale, not just unknown yet."""
        for key, wanted in self.wanted.items():
            current = self.seen.get(key)
            if current is None:
                if wanted.create:
                    await self._create(key, wanted)
                continue
            if not self.claims(current):
                continue  # a Proxy of its own holds the name: never taken over
            patch = mirror_patch(current, wanted.body)
            if patch is None:
                continue
            updated = await self.api.patch_mirror(key[0], key[1], patch)
            if updated is not None:
                log.info("mirror put back", namespace=key[0], name=key[1])
                self.observed(updated)
        if not complete:
            return
        for key, raw in list(self.seen.items()):
            if key in self.wanted or not is_mirror(raw):
                continue
            uid = _uid(raw)
            self.ours.add(uid)
            if await self.api.delete_mirror(key[0], key[1], uid):
                log.info("mirror deleted", namespace=key[0], name=key[1], member=mirror_member(raw))
            self.seen.pop(key, None)

    async def _create(self, key: Key, wanted: Wanted) -> None:
        created = await self.api.create_mirror(key[0], wanted.body)
        if created is None:
            return  # the name is taken; the Proxy watch shows by whom
        self.observed(created)

    async def rotate(self, uid: str) -> bool:
        """Ask for a fresh instance of a member, as the pool controller does for an aged one;
        nothing if it is going, or a rotation is under way already."""
        requested = await request_rotation(
            self.store, uid, cause="mirror-deleted", client=REQUESTER
        )
        if requested == "contended":
            log.warning("a member kept changing while its replacement was asked for", uid=uid)
        return requested == "requested"
