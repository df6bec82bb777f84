"""The ``digitalocean`` provider: Droplets through the DigitalOcean API (docs/providers.md).

Every call is fire-and-forget: ``create`` returns once DigitalOcean has accepted the droplet and
the reconciler follows it by polling ``get``. Droplet names are not unique at DigitalOcean, so a
create is made idempotent here: under a lock per name (in this process), it looks for a droplet
of this entry with the name first and returns it when found. The entry's cloud firewall is made
before the droplet and checked after it (``firewall.py`` says why); once the entry has no
droplet left, the firewall is a leftover for GC.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import structlog

from services.providers.base import (
    OWNER_LABEL,
    CreateRequest,
    Instance,
    Leftover,
    NotFound,
    Permanent,
    ProviderError,
)
from services.providers.cloud.names import NameLocks
from services.providers.cloud.pure.leftovers import firewall_id_of, firewall_leftovers
from services.providers.cloud.pure.spread import spread
from services.providers.cloud.pure.userdata import vm_user_data
from services.providers.digitalocean import preflight
from services.providers.digitalocean.catalogue import Catalogue
from services.providers.digitalocean.client import Api, Token
from services.providers.digitalocean.config import (
    REGION,
    SIZE,
    TOKEN_VARIABLES,
    DigitalOceanConfig,
    image_ok,
)
from services.providers.digitalocean.firewall import Firewall, unexpected
from services.providers.digitalocean.pure import mapping
from services.providers.digitalocean.pure.catalogue import size_problem
from services.providers.digitalocean.pure.classify import field_of
from services.providers.preflight import Finding
from services.runtime.settings.errors import ConfigError

__all__ = ["DigitalOceanConfig", "DigitalOceanProvider"]

log = structlog.get_logger("egress.provider.digitalocean")
MAX_PAGES = 1000
NOT_IN_REGION = "not available in this region"
"""DigitalOcean's words for a size not offered where it was asked for."""
"""200 droplets a page: far beyond any account's droplet limit; a bound, not a expectation."""


class DigitalOceanProvider:
    """A ``Provider`` and ``LeftoverCleaner`` making one droplet per instance.

    ``token`` is the API token (``from_config`` reads it from the environment; tests pass one);
    ``page_size`` is the listings' page size (tests make it small to exercise paging)."""

    type = "digitalocean"

    def __init__(
        self, name: str, config: DigitalOceanConfig, *, token: str = "", page_size: int = 200
    ) -> None:
        self.name = name
        self.config = config
        self.page_size = page_size
        self.api = Api(name, config, Token(token) if token else None)
        self.firewall = Firewall(self.api, name, config)
        self.catalogue = Catalogue(self.api, name)
        self._names = NameLocks()

    @classmethod
    def from_config(cls, name: str, config: DigitalOceanConfig) -> DigitalOceanProvider:
        token = next((os.environ[v] for v in TOKEN_VARIABLES if os.environ.get(v)), "")
        if not token and not config.token_file:
            raise ConfigError(
                "no DigitalOcean API token: set DIGITALOCEAN_TOKEN (or DIGITALOCEAN_ACCESS_TOKEN) "
                "in the environment, or digitalocean.tokenFile to a file holding it"
            )
        return cls(name, config, token=token)

    def __repr__(self) -> str:
        return f"DigitalOceanProvider({self.name!r})"

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        where = f"{self.name}: create {request.name}"
        body = self._body(request, where)
        await self._check_size(request, where)
        async with self._names.held(request.name):
            await self.firewall.ensure()
            existing = await self._find(request.name)
            if existing is not None:
                return str(existing.id)
            try:
                reply = await self.api.request(
                    "create", where, lambda c, kw: c.droplets.create(body, **kw)
                )
            except Permanent as exc:
                if NOT_IN_REGION in str(exc):
                    self.catalogue.forget()  # it said otherwise: read it again next time
                raise Permanent(self._with_field(str(exc), request)) from exc
            raw = reply.body.get("droplet")
            droplet = mapping.droplet_of(raw) if isinstance(raw, dict) else None
            if droplet is None:
                raise unexpected(where, reply.body)
            log.info(
                "droplet create accepted",
                provider=self.name,
                id=droplet.id,
                name=request.name,
                region=body["region"],
                size=body["size"],
            )
            await self.firewall.recheck()
            return str(droplet.id)

    async def get(self, provider_id: str) -> Instance:
        droplet_id = mapping.parse_droplet_id(provider_id)
        if droplet_id is None:
            raise NotFound(f"{self.name}: {provider_id!r} is not a droplet id this provider issues")
        what = f"{self.name}: get droplet {provider_id}"
        reply = await self.api.request(
            "get", what, lambda c, kw: c.droplets.get(droplet_id, **kw), absent_ok=True
        )
        if reply.status == 404:
            raise NotFound(f"{what}: it does not exist")
        raw = reply.body.get("droplet")
        droplet = mapping.droplet_of(raw) if isinstance(raw, dict) else None
        if droplet is None:
            raise unexpected(what, reply.body)
        instance = self._instance(droplet)
        if instance is None:
            raise NotFound(f"{what}: destroyed (archived)")
        return instance

    async def delete(self, provider_id: str) -> None:
        droplet_id = mapping.parse_droplet_id(provider_id)
        if droplet_id is None:
            return  # could never have been created
        await self.api.request(
            "delete",
            f"{self.name}: delete droplet {provider_id}",
            lambda c, kw: c.droplets.destroy(droplet_id, **kw),
            absent_ok=True,
        )

    async def list_by_tag(self) -> list[Instance]:
        tag = mapping.provider_tag(self.name)
        found = await self._droplets(f"{self.name}: list droplets", tag_name=tag)
        instances = (self._instance(d) for d in found if mapping.is_managed_by(d.tags, self.name))
        return [i for i in instances if i is not None]

    async def close(self) -> None:
        await self.api.close()

    # ---------------------------------------------------------------- Preflight

    async def preflight(self) -> list[Finding]:
        """Token, quota, image, size per region and firewall, read-only (``preflight.py``)."""
        return await preflight.check(self)

    # ---------------------------------------------------------------- LeftoverCleaner

    async def leftovers(self) -> list[Leftover]:
        """The entry's firewall, once no droplet of the entry exists (D115)."""
        if await self.list_by_tag():
            return []
        return firewall_leftovers(
            self.name,
            (
                (
                    mapping.firewall_leftover_id(str(f.get("id"))),
                    mapping.parse_timestamp(f.get("created_at")),
                )
                for f in await self.firewall.find_all()
            ),
        )

    async def delete_leftover(self, leftover: Leftover) -> bool:
        firewall_id = firewall_id_of(
            self.name, leftover, mapping.parse_firewall_id, "firewalls/<uuid>"
        )
        found = await self.firewall.get(firewall_id)
        if found is None:
            return True
        if found.get("name") != self.firewall.name:
            raise Permanent(
                f"{self.name}: firewall {firewall_id} is named {found.get('name')!r}, not "
                f"{self.firewall.name!r}: not this entry's; it is left alone"
            )
        if await self.list_by_tag():
            return False
        await self.firewall.delete(firewall_id)
        try:
            if await self.list_by_tag():  # a create between our look and the delete
                await self.firewall.ensure()
        except ProviderError as exc:
            log.warning(
                "could not check for droplets made while the firewall was deleted; the next "
                "create makes it again",
                provider=self.name,
                error=f"{type(exc).__name__}: {exc}",
            )
        return True

    # ---------------------------------------------------------------- internals

    async def _find(self, name: str) -> mapping.Droplet | None:
        """This entry's droplet named ``name`` (the oldest, should there be several)."""
        found = [
            d
            for d in await self._droplets(f"{self.name}: find droplet {name}", name=name)
            if d.name == name and mapping.is_managed_by(d.tags, self.name) and d.state is not None
        ]
        return min(found, key=lambda d: d.id) if found else None

    async def _droplets(self, what: str, **query: str) -> list[mapping.Droplet]:
        droplets: list[mapping.Droplet] = []
        tag = query.get("tag_name", "")
        for page in range(1, MAX_PAGES + 1):
            reply = await self.api.request(
                "list", what, self._listing(page, query), absent_ok=bool(tag)
            )
            if reply.status == 404:
                await self._tag_absent(what, tag)
                return []
            items = reply.body.get("droplets")
            items = items if isinstance(items, list) else []
            droplets += [d for d in map(_droplet, items) if d is not None]
            if not items or not mapping.next_page(reply.body):
                break
        return droplets

    async def _tag_absent(self, what: str, tag: str) -> None:
        """A listing by ``tag`` answered 404. DigitalOcean's reference documents 200 with no
        droplet for a tag nobody made yet (an entry before its first create), but were it to
        answer 404, that means "no droplet" only if the tag is really absent: an empty answer
        makes the firewall a GC leftover, and a wrongly empty one would open droplets to the
        world. So the tag is looked up; a tag that exists makes the 404 an error."""
        found = await self.api.request(
            "get",
            f"{what}: get tag {tag}",
            lambda c, kw: c.tags.get(tag, **kw),
            absent_ok=True,
        )
        if found.status != 404:
            raise Permanent(
                f"{what}: the listing by tag {tag} answered 404 although the tag exists; "
                "check the entry's endpointUrl"
            )

    def _listing(self, page: int, query: dict[str, str]) -> Callable[[Any, dict[str, Any]], Any]:
        # ``params``: every pydo version passes it on; the ``name`` keyword is recent.
        return lambda c, kw: c.droplets.list(
            per_page=self.page_size, page=page, params=dict(query), **kw
        )

    def _instance(self, droplet: mapping.Droplet) -> Instance | None:
        state = droplet.state
        if state is None:
            return None
        labels = droplet.labels()
        return Instance(
            provider_id=str(droplet.id),
            name=droplet.name,
            state=state,
            owner_uid=labels.get(OWNER_LABEL, ""),
            created_at=droplet.created_at,
            ip=droplet.ip,
            port=self.config.proxy_port,
            instance_uid=str(droplet.id),
            labels=labels,
        )

    async def _check_size(self, request: CreateRequest, where: str) -> None:
        """Refuse, Permanent, a size the catalogue says cannot be made in the request's region,
        before the firewall and the name lookup are made for it (D142). An unreadable
        catalogue leaves the answer to the create itself."""
        region, size, _ = self._placement(request)
        try:
            sizes = await self.catalogue.sizes()
        except ProviderError as exc:
            log.warning(
                "the size catalogue could not be read; the create goes on without the check",
                provider=self.name,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        placement = request.spec.placement
        field = "spec.placement.machineType" if placement.machine_type else "size"
        problem = size_problem(sizes, size, region, field)
        if problem:
            source = "spec.placement.region" if placement.region else "regions"
            raise Permanent(f"{where}: {problem} (the region {region} comes from {source})")

    def _placement(self, request: CreateRequest) -> tuple[str, str, str]:
        placement = request.spec.placement
        return (
            placement.region or spread(self.config.regions, request.name),
            placement.machine_type or self.config.size,
            placement.image or self.config.image,
        )

    def _body(self, request: CreateRequest, where: str) -> dict[str, Any]:
        """The create body; anything DigitalOcean would refuse fails here, Permanent, naming
        the field, before any call."""
        placement = request.spec.placement
        region, size, image = self._placement(request)
        if placement.zone:
            raise Permanent(
                f"{where}: spec.placement.zone {placement.zone!r}: DigitalOcean has no zones; "
                "use spec.placement.region (a region slug such as fra1)"
            )
        problems = [
            ("spec.placement.region", region, bool(REGION.match(region)), "a slug such as fra1"),
            ("spec.placement.machineType", size, bool(SIZE.match(size)), "a size slug"),
            ("spec.placement.image", image, image_ok(image), "an image slug or id"),
        ]
        for field, value, ok, fix in problems:
            if not ok:
                raise Permanent(
                    f"{where}: {field} {value!r} is not valid at DigitalOcean; use {fix}"
                )
        if not mapping.DROPLET_NAME.match(request.name):
            raise Permanent(
                f"{where}: {request.name!r} is not a valid droplet name (letters, digits, '.' "
                "and '-', at most 255)"
            )
        try:
            tags = mapping.droplet_tags(
                self.name,
                request.owner_uid,
                request.spec_hash,
                namespace=request.namespace,
                proxy_name=request.proxy_name,
            )
        except mapping.TagError as exc:
            raise Permanent(f"{where}: {exc}") from exc
        user_data = vm_user_data(request.cloud_init, self.config, self.name)
        size_bytes = len(user_data.encode("utf-8", "surrogatepass"))
        if size_bytes > mapping.MAX_USER_DATA:
            raise Permanent(
                f"{where}: the user data is {size_bytes} bytes; DigitalOcean takes at most "
                f"{mapping.MAX_USER_DATA}: shorten spec.cloudInit"
            )
        body: dict[str, Any] = {
            "name": request.name,
            "region": region,
            "size": size,
            "image": int(image) if image.isdigit() else image,
            "tags": tags,
            "ipv6": self.config.ipv6,
            "monitoring": False,
            "backups": False,
        }
        if user_data:
            body["user_data"] = user_data
        if self.config.vpc_uuid:
            body["vpc_uuid"] = self.config.vpc_uuid
        if self.config.ssh_keys:
            body["ssh_keys"] = [int(k) if k.isdigit() else k for k in self.config.ssh_keys]
        return body

    def _with_field(self, message: str, request: CreateRequest) -> str:
        """A refusal about the region, size or image, saying where that value came from."""
        field = field_of(message)
        placement = request.spec.placement
        region, size, image = self._placement(request)
        sources = {
            "region": (region, "spec.placement.region" if placement.region else "regions"),
            "size": (size, "spec.placement.machineType" if placement.machine_type else "size"),
            "image": (image, "spec.placement.image" if placement.image else "image"),
        }
        if field not in sources:
            return message
        value, source = sources[field]
        return f"{message} (the {field} {value!r} comes from {source})"


def _droplet(raw: object) -> mapping.Droplet | None:
    return mapping.droplet_of(raw) if isinstance(raw, dict) else None
