"""The digitalocean entry checked against DigitalOcean before it costs anything (D142; the
capability is ``services/providers/preflight.py``).

Read-only calls only, each answer read into one finding with its fix:

- ``credentials``: ``/v2/account`` answers for the token and the account is ``active`` (a locked
  or unverified account refuses creates); nothing else is asked when it does not;
- ``quota``: the account's ``droplet_limit`` against the droplets it has (``meta.total`` of a
  one-item listing): the room left for proxies;
- ``droplets of this entry``: the listing by the entry's tag, which GC and recovery make (a
  scoped token needs the tag read scope for it);
- ``image``: ``/v2/images/<slug or id>`` finds it, available, in every region listed;
- ``size in <region>``: the size catalogue (``catalogue.py``) offers the size there, with the
  regions where it would work when it does not; the same words a create is refused with;
- ``firewall``: the rules the entry would write, and whether its firewall exists and matches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from services.providers.base import ProviderError
from services.providers.cloud.pure.settings import client_networks
from services.providers.digitalocean.pure import mapping
from services.providers.digitalocean.pure.catalogue import offered_in, size_problem
from services.providers.digitalocean.pure.classify import AUTH_FIX
from services.providers.preflight import Finding

if TYPE_CHECKING:
    from services.providers.digitalocean.provider import DigitalOceanProvider

IMAGE_FIX = (
    "use a distribution image slug (`doctl compute image list-distribution`), e.g. "
    "debian-12-x64, or the id of an image of this account"
)
QUOTA_FIX = (
    "delete droplets this account no longer needs, or ask DigitalOcean to raise its droplet limit"
)
SCOPE_FIX = (
    "give the token read and write access to droplets, firewalls and tags, and read access to "
    "sizes, images and the account"
)
API_FIX = "check the entry's endpointUrl and that this machine reaches the DigitalOcean API"


def _error(check: str, exc: ProviderError) -> Finding:
    text = f"{type(exc).__name__}: {exc}"
    fix = AUTH_FIX if "HTTP 401" in text or "HTTP 403" in text else API_FIX
    return Finding(check, False, text, fix)


async def _answer(
    do: DigitalOceanProvider, what: str, call: Callable[[Any, dict[str, Any]], Awaitable[Any]]
) -> dict[str, Any] | None:
    """The body of a read, None for a 404; raises the taxonomy's errors otherwise."""
    reply = await do.api.request("get", f"{do.name}: preflight: {what}", call, absent_ok=True)
    return None if reply.status == 404 else reply.body


async def check(do: DigitalOceanProvider) -> list[Finding]:
    findings = await _account(do)
    if not all(f.ok for f in findings if f.check == "credentials"):
        return findings  # every other call would meet the same refusal
    findings.append(await _entry_listing(do))
    findings += await _image(do)
    findings += await _sizes(do)
    findings.append(await _firewall(do))
    return findings


async def _account(do: DigitalOceanProvider) -> list[Finding]:
    try:
        body = await _answer(do, "get account", lambda c, kw: c.account.get(**kw))
        listing = await do.api.request(
            "list",
            f"{do.name}: preflight: count droplets",
            lambda c, kw: c.droplets.list(per_page=1, page=1, **kw),
        )
    except ProviderError as exc:
        return [_error("credentials", exc)]
    account = (body or {}).get("account")
    if not isinstance(account, dict):
        return [Finding("credentials", False, "/v2/account answered no account", API_FIX)]
    status = str(account.get("status") or "")
    if status != "active":
        said = str(account.get("status_message") or "no reason given")
        return [
            Finding(
                "credentials",
                False,
                f"the token is valid, but the account is {status or 'of no status'} ({said})",
                "settle the account's status in DigitalOcean's control panel (billing, email "
                "verification): it refuses creates until then",
            )
        ]
    found = [Finding("credentials", True, "the token is valid; the account is active")]
    limit, meta = account.get("droplet_limit"), listing.body.get("meta")
    total = meta.get("total") if isinstance(meta, dict) else None
    if not isinstance(limit, int) or not isinstance(total, int):
        found.append(Finding("quota", True, "the API does not say the droplet limit or count"))
    elif total >= limit:
        found.append(
            Finding("quota", False, f"{total} of {limit} droplets in use: no room left", QUOTA_FIX)
        )
    else:
        found.append(
            Finding("quota", True, f"{total} of {limit} droplets in use: room for {limit - total}")
        )
    return found


async def _entry_listing(do: DigitalOceanProvider) -> Finding:
    check = "droplets of this entry"
    try:
        instances = await do.list_by_tag()
    except ProviderError as exc:
        finding = _error(check, exc)
        forbidden = "HTTP 403" in finding.detail
        return Finding(check, False, finding.detail, SCOPE_FIX if forbidden else finding.fix)
    tag = mapping.provider_tag(do.name)
    return Finding(check, True, f"{len(instances)} droplet(s) carry the tag {tag}")


async def _image(do: DigitalOceanProvider) -> list[Finding]:
    image = do.config.image
    try:
        body = await _answer(do, f"get image {image}", lambda c, kw: c.images.get(image, **kw))
    except ProviderError as exc:
        return [_error("image", exc)]
    found = (body or {}).get("image")
    if not isinstance(found, dict):
        return [Finding("image", False, f"image {image!r} not found", IMAGE_FIX)]
    status = str(found.get("status") or "available")
    if status != "available":
        return [Finding("image", False, f"image {image!r} is {status}, not available", IMAGE_FIX)]
    regions = found.get("regions")
    offered = {r for r in regions if isinstance(r, str)} if isinstance(regions, list) else set()
    missing = [r for r in do.config.regions if offered and r not in offered]
    if missing:
        return [
            Finding(
                "image",
                False,
                f"image {image!r} is not available in {', '.join(missing)} (it is in "
                f"{', '.join(sorted(offered))})",
                "transfer the image to those regions, or use a distribution image",
            )
        ]
    kind = str(found.get("type") or "")
    name = f"{found.get('distribution') or ''} {found.get('name') or ''}".strip() or image
    runs = (
        "a distribution image: cloud-init runs the install script"
        if kind == "base"
        else f"a {kind or 'custom'} image: it runs the install script only if it has cloud-init"
    )
    return [Finding("image", True, f"{image} is {name}, {runs}")]


async def _sizes(do: DigitalOceanProvider) -> list[Finding]:
    try:
        sizes = await do.catalogue.sizes()
    except ProviderError as exc:
        return [_error("size catalogue", exc)]
    size = do.config.size
    findings = []
    for region in do.config.regions:
        problem = size_problem(sizes, size, region, "size")
        if not problem:
            findings.append(Finding(f"size in {region}", True, f"{size} is offered in {region}"))
            continue
        cheapest = offered_in(sizes, region)[:1]
        instead = f" (e.g. {cheapest[0]})" if cheapest else ""
        fix = f"set size to one offered in {region}{instead}, or drop {region} from regions"
        findings.append(Finding(f"size in {region}", False, problem, fix))
    return findings


async def _firewall(do: DigitalOceanProvider) -> Finding:
    networks = client_networks(do.config)
    port = do.config.proxy_port
    would = (
        f"tcp {port} in from {', '.join(networks)}; tcp, udp and icmp out to everywhere, "
        f"for the droplets tagged {mapping.provider_tag(do.name)}"
    )
    try:
        existing = await do.firewall.find_all()
    except ProviderError as exc:
        return _error("firewall", exc)
    if not existing:
        return Finding("firewall", True, f"{do.firewall.name} made at the first create: {would}")
    differs = mapping.firewall_differs(existing[0], do.name, port, networks)
    state = (
        f"exists; its {', '.join(differs)} put right at the next create"
        if differs
        else ("exists and matches")
    )
    return Finding("firewall", True, f"{do.firewall.name} {state}: {would}")
