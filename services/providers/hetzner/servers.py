"""The server calls of the hetzner provider, one blocking request each (some answers take a
second), run in its worker threads: submit a create, find a server by name, read one as an
``Instance``. Split from ``provider.py``, which decides when to call them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hcloud import APIException, Client
from hcloud.firewalls import Firewall
from hcloud.images import Image
from hcloud.locations import Location
from hcloud.networks import Network
from hcloud.server_types import ServerType
from hcloud.servers import BoundServer, ServerCreatePublicNetwork
from hcloud.ssh_keys import SSHKey

from services.providers.base import OWNER_LABEL, Instance, Permanent, ProviderError
from services.providers.hetzner.client import api_error, scrub, token_of
from services.providers.hetzner.config import HetznerConfig
from services.providers.hetzner.pure import catalogue, mapping


class FirewallGone(Exception):
    """The create named a firewall Hetzner no longer has (GC deleted it meanwhile)."""


class NoRoom(Exception):
    """The location has no capacity for the server now (``catalogue.CAPACITY_CODES``):
    ``answer`` is Hetzner's code and message, ``error`` the taxonomy's reading of it."""

    def __init__(self, answer: str, error: ProviderError) -> None:
        super().__init__(answer)
        self.answer = answer
        self.error = error


@dataclass(frozen=True, slots=True)
class Submission:
    """One create request's contents, all but where the walk sends it."""

    entry: str
    name: str
    labels: dict[str, str]
    user_data: str
    what: str


def submit(
    client: Client,
    config: HetznerConfig,
    sent: Submission,
    place: mapping.Place,
    firewall_id: int,
) -> str:
    """The new server's id, or that of the server a concurrent create of the name made."""
    try:
        response = client.servers.create(
            name=sent.name,
            server_type=ServerType(name=place.server_type),
            image=Image(id=int(place.image)) if place.image.isdigit() else Image(name=place.image),
            location=Location(name=place.location),
            user_data=sent.user_data or None,
            labels=sent.labels,
            firewalls=[Firewall(id=firewall_id)],
            public_net=ServerCreatePublicNetwork(enable_ipv4=True, enable_ipv6=config.ipv6),
            ssh_keys=[_ssh_key(key) for key in config.ssh_keys] or None,
            networks=[Network(id=config.network)] if config.network else None,
        )
    except APIException as exc:
        if exc.code == "uniqueness_error":
            found = find_by_name(client, sent.entry, sent.name, sent.what)
            if found is not None:
                return found  # a concurrent create elsewhere won: the same server
        if exc.code in ("not_found", "invalid_input") and "firewall" in str(exc).lower():
            scrub(exc, token_of(client))
            raise FirewallGone(str(exc)) from exc
        if exc.code in catalogue.CAPACITY_CODES:
            scrub(exc, token_of(client))
            error = api_error(exc, op="create", what=f"{sent.what} in {place.location}")
            raise NoRoom(f"{exc.code}: {exc.message}", error) from exc
        raise
    return mapping.provider_id(int(response.server.data_model.id or 0))


def find_by_name(client: Client, entry: str, name: str, what: str) -> str | None:
    """The id of the server called ``name``, wherever it is (names are unique in a project,
    whatever the location); Permanent when it is not ``entry``'s."""
    found = client.servers.get_by_name(name)
    if found is None:
        return None
    if not mapping.is_entrys(found.data_model.labels, entry):
        raise Permanent(
            f"{what}: a server named {name} exists that this provider did not make "
            f"(no labels {mapping.label_selector(entry)}); delete or rename it"
        )
    return mapping.provider_id(int(found.data_model.id or 0))


def any_server(client: Client, entry: str) -> bool:
    servers, _ = client.servers.get_list(label_selector=mapping.label_selector(entry), per_page=1)
    return bool(servers)


def instance(server: BoundServer, port: int) -> Instance:
    model = server.data_model
    public = model.public_net
    ipv4 = public.ipv4.ip if public is not None and public.ipv4 is not None else ""
    ipv6 = public.ipv6.ip if public is not None and public.ipv6 is not None else ""
    address = mapping.public_address(ipv4 or "", ipv6 or "")
    labels = dict(model.labels or {})
    created_at = mapping.parse_created(model.created)
    server_id = mapping.provider_id(int(model.id or 0))
    return Instance(
        provider_id=server_id,
        name=model.name or "",
        state=mapping.state_of(model.status or "", address),
        owner_uid=labels.get(OWNER_LABEL, ""),
        created_at=created_at,
        ip=address,
        port=port,
        instance_uid=server_id,
        labels=mapping.with_created_label(labels, created_at),
    )


def status(client: Client, server_id: int) -> str | None:
    """The server's status now, None when it is gone."""
    try:
        return client.servers.get_by_id(server_id).data_model.status
    except APIException as exc:
        if exc.code == "not_found":
            return None
        raise


def _ssh_key(key: str) -> SSHKey:
    return SSHKey(id=int(key)) if key.isdigit() else SSHKey(name=key)
