"""The entry's cloud firewall (docs/providers.md, "Cloud VMs", and D115).

A DigitalOcean cloud firewall applies to droplets by tag: the firewall names the entry's provider
tag, and every droplet carrying the tag is behind it from the moment it exists. A droplet behind
no firewall at all is open to the world on every port, so the order matters: the firewall is
made (or found, and its rules put right) *before* the droplet, and looked at again *after* it,
in case GC deleted it in between (it re-checks for instances, but a droplet can appear between
its check and its delete; GC also looks once more after deleting, see ``delete``).

Firewall names are not unique at DigitalOcean; the entry's is ``firewall_name(entry)``, found by
listing. Should two exist (two processes made one each), the oldest is used and both are
reported as leftovers once the entry has no instance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from services.providers.base import Transient
from services.providers.cloud.pure.firewall import firewall_name
from services.providers.cloud.pure.settings import client_networks
from services.providers.digitalocean.client import Api
from services.providers.digitalocean.config import DigitalOceanConfig
from services.providers.digitalocean.pure import mapping

log = structlog.get_logger("egress.provider.digitalocean")
PAGE_SIZE = 200
MAX_PAGES = 100


class Firewall:
    def __init__(self, api: Api, provider: str, config: DigitalOceanConfig) -> None:
        self.api = api
        self.provider = provider
        self.name = firewall_name(provider)
        self.config = config
        self.cached_id = ""
        self.lock = asyncio.Lock()

    def _body(self) -> dict[str, Any]:
        return mapping.firewall_body(
            self.name, self.provider, self.config.proxy_port, client_networks(self.config)
        )

    async def ensure(self) -> str:
        """The firewall's id, after making it or putting its rules right if needed."""
        async with self.lock:
            found: dict[str, Any] | None = None
            if self.cached_id:
                found = await self._get(self.cached_id)
            if found is None:
                named = await self.find_all()
                found = named[0] if named else None
            if found is None:
                return await self._create()
            self.cached_id = str(found.get("id") or "")
            differs = mapping.firewall_differs(
                found, self.provider, self.config.proxy_port, client_networks(self.config)
            )
            if differs:
                await self._put_right(self.cached_id, differs)
            return self.cached_id

    async def recheck(self) -> None:
        """After a droplet was made: the firewall must still exist, or the droplet is open."""
        async with self.lock:
            if self.cached_id and await self._get(self.cached_id) is not None:
                return
            log.warning(
                "the firewall vanished while a droplet was made; making it again",
                provider=self.provider,
                firewall=self.name,
            )
            self.cached_id = ""
        await self.ensure()

    async def find_all(self) -> list[dict[str, Any]]:
        """Every firewall with this entry's name, oldest first."""
        found: list[dict[str, Any]] = []
        for page in range(1, MAX_PAGES + 1):
            reply = await self.api.request(
                "list",
                f"{self.provider}: list firewalls",
                _listing(page),
            )
            items = reply.body.get("firewalls")
            items = items if isinstance(items, list) else []
            found += [f for f in items if isinstance(f, dict) and f.get("name") == self.name]
            if not items or not mapping.next_page(reply.body):
                break
        found.sort(key=lambda f: (mapping.parse_timestamp(f.get("created_at")), str(f.get("id"))))
        return found

    async def get(self, firewall_id: str) -> dict[str, Any] | None:
        """Any firewall by id, whatever its name (None: it does not exist)."""
        reply = await self.api.request(
            "get",
            f"{self.provider}: get firewall {firewall_id}",
            _call(lambda c, kw: c.firewalls.get(firewall_id, **kw)),
            absent_ok=True,
        )
        firewall = reply.body.get("firewall")
        return firewall if reply.status != 404 and isinstance(firewall, dict) else None

    async def delete(self, firewall_id: str) -> None:
        """Delete one firewall of this entry (gone already is fine)."""
        async with self.lock:
            await self.api.request(
                "delete",
                f"{self.provider}: delete firewall {firewall_id}",
                _call(lambda c, kw: c.firewalls.delete(firewall_id, **kw)),
                absent_ok=True,
            )
            if self.cached_id == firewall_id:
                self.cached_id = ""
        log.info("firewall deleted", provider=self.provider, firewall=self.name, id=firewall_id)

    # ---------------------------------------------------------------- internals

    async def _get(self, firewall_id: str) -> dict[str, Any] | None:
        """This entry's firewall by id; None when gone (or renamed: then it is not ours)."""
        firewall = await self.get(firewall_id)
        return firewall if firewall is not None and firewall.get("name") == self.name else None

    async def _tag(self) -> None:
        """A firewall may name only tags that exist; a droplet create makes its tags, but the
        firewall comes first. Looked up before it is made: what a POST of an existing tag
        answers is not something to rely on."""
        tag = mapping.provider_tag(self.provider)
        found = await self.api.request(
            "get",
            f"{self.provider}: get tag {tag}",
            _call(lambda c, kw: c.tags.get(tag, **kw)),
            absent_ok=True,
        )
        if found.status != 404:
            return
        await self.api.request(
            "tag",
            f"{self.provider}: create tag {tag}",
            _call(lambda c, kw: c.tags.create({"name": tag}, **kw)),
        )

    async def _create(self) -> str:
        await self._tag()
        reply = await self.api.request(
            "firewall",
            f"{self.provider}: create firewall {self.name}",
            _call(lambda c, kw: c.firewalls.create(self._body(), **kw)),
        )
        firewall = reply.body.get("firewall")
        made = str(firewall.get("id") or "") if isinstance(firewall, dict) else ""
        if not made:
            raise unexpected(f"{self.provider}: create firewall {self.name}", reply.body)
        self.cached_id = made
        log.info(
            "firewall made",
            provider=self.provider,
            firewall=self.name,
            id=made,
            port=self.config.proxy_port,
            allowed=client_networks(self.config),
        )
        return made

    async def _put_right(self, firewall_id: str, differs: list[str]) -> None:
        await self._tag()
        await self.api.request(
            "firewall",
            f"{self.provider}: update firewall {self.name}",
            _call(lambda c, kw: c.firewalls.update(firewall_id, self._body(), **kw)),
        )
        log.info(
            "firewall put right",
            provider=self.provider,
            firewall=self.name,
            id=firewall_id,
            changed=differs,
            allowed=client_networks(self.config),
        )


def _listing(page: int) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda c, kw: c.firewalls.list(per_page=PAGE_SIZE, page=page, **kw)


def _call(fn: Callable[[Any, dict[str, Any]], Any]) -> Callable[[Any, dict[str, Any]], Any]:
    """Typing aid: pydo's operation groups are untyped attributes of the client."""
    return fn


def unexpected(what: str, body: dict[str, Any]) -> Transient:
    """An answer without what a 2xx promises: a proxy in between, or an API change."""
    return Transient(f"{what}: the answer has no id (keys: {sorted(body)})")
