"""The hetzner entry checked against Hetzner without creating anything (``Preflight``,
services/providers/preflight.py; docs/decisions/0141-hetzner-places-from-its-catalogue.md).

In order: the token (a read-only call, listing the entry's servers; a token refused there
ends the check, every other call would be refused the same way), the server type in each
location listed (``GET /server_types``, through the create's own cache), the image for the
type's architecture, the firewall the next create would write, and the quota, which Hetzner's
API does not tell. Whether a token may *write* cannot be read: Hetzner says so at the first
create (``token_readonly``), and the credentials finding says that.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from hcloud import APIException, Client

from services.providers.base import ProviderError, Transient
from services.providers.hetzner import catalogue, firewall
from services.providers.hetzner.config import HetznerConfig
from services.providers.hetzner.pure import mapping
from services.providers.hetzner.pure import preflight as words
from services.providers.hetzner.pure.catalogue import TypeInfo
from services.providers.preflight import Finding

T = TypeVar("T")


class Entry(Protocol):
    """What the preflight needs of the provider (``HetznerProvider``)."""

    name: str
    config: HetznerConfig
    firewall_name: str
    wanted_rules: list[mapping.Rule]

    async def read(self, what: str, call: Callable[[Client], T]) -> T: ...

    async def server_type(self, name: str, what: str) -> TypeInfo: ...


async def preflight(entry: Entry) -> list[Finding]:
    what = f"{entry.name}: preflight"
    try:
        count = await entry.read(f"{what}: credentials", lambda c: _servers(c, entry.name))
    except ProviderError as exc:
        return [Finding("credentials", False, str(exc), _token_fix(exc, entry.config))]
    findings = [
        Finding(
            "credentials",
            True,
            f"the token was accepted by a read-only call (the entry has {count} servers); "
            "whether it may write shows at the first create (token_readonly)",
        )
    ]
    config = entry.config
    architecture = catalogue.DEFAULT_ARCHITECTURE
    try:
        info = await entry.server_type(config.server_type, what)
    except ProviderError as exc:
        findings.append(_failed("size", exc))
    else:
        architecture = info.architecture or architecture
        now = datetime.now(UTC)
        findings += [Finding(*check) for check in words.sizes(info, config.locations, now)]
    try:
        found = await entry.read(
            f"{what}: image {config.image}",
            lambda c: _image(c, config.image, architecture),
        )
    except ProviderError as exc:
        findings.append(_failed("image", exc))
    else:
        check = words.image(config.image, architecture, found, install_squid=config.install_squid)
        findings.append(Finding(*check))
    try:
        plan = await entry.read(
            f"{what}: firewall",
            lambda c: firewall.planned(c, entry.firewall_name, entry.name, entry.wanted_rules),
        )
    except ProviderError as exc:
        findings.append(
            _failed("firewall", exc, "delete or rename that firewall, or give it the labels")
        )
    else:
        findings.append(Finding("firewall", True, plan))
    findings.append(Finding("quota", True, words.QUOTA))
    return findings


def _servers(client: Client, entry: str) -> int:
    _, meta = client.servers.get_list(label_selector=mapping.label_selector(entry), per_page=1)
    pagination = getattr(meta, "pagination", None)
    return int(getattr(pagination, "total_entries", 0) or 0)


def _image(client: Client, image: str, architecture: str) -> tuple[int, str, str, str] | None:
    found = catalogue.find_image(client, image, architecture)
    if found is None:
        return None
    model = found.data_model
    return (
        int(model.id or 0),
        str(model.type or "?"),
        str(model.os_flavor or ""),
        str(model.os_version or ""),
    )


def _token_fix(exc: ProviderError, config: HetznerConfig) -> str:
    if isinstance(exc, Transient):
        return f"check that this machine reaches {config.api_endpoint} (proxy, firewall, DNS)"
    cause = exc.__cause__
    if isinstance(cause, APIException) and cause.code != "unauthorized":
        return "see the detail"
    where = (
        f"the file tokenFile names ({config.token_file})" if config.token_file else ("HCLOUD_TOKEN")
    )
    return f"put a Read & Write API token of the servers' project in {where}"


def _failed(check: str, exc: ProviderError, fix: str = "see the detail") -> Finding:
    if isinstance(exc, Transient):
        fix = "try again: Hetzner did not answer this call"
    return Finding(check, False, str(exc), fix)
