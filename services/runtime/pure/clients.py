"""Who may call the discovery API: the clients file, parsed strictly (docs/api.md, "Clients").
It lives below the services, so every service that authenticates with the same file reads it
alike (docs/decisions/0154-the-clients-table-below-the-services.md).

A bearer token shared by every crawler separates the crawlers from everyone else, not one
crawler from another. So each client is named, with its own token, the scopes it may use and its
limits, and a lease belongs to the client that acquired it
(docs/decisions/0096-a-lease-belongs-to-a-client-a.md)::

    clients:
      - name: crawler-a
        token: sha256:<64 hex digits>     # egress-proxies clients hash < token-file
        scopes: [lease, read]
        maxLeases: 20                     # optional: most leases held at once
        selectors:                        # optional: an acquire must ask for one of these
          - {country: de}
          - {pool: crawl/de}              # a pool is bound to its namespace (NAME: default)

The file holds hashes, never tokens: a leaked copy (a backup, a ``kubectl get secret`` on the
wrong screen) opens nothing. SHA-256 and not a password hash, because a token is 32 random bytes
(``openssl rand -hex 32``), which no dictionary holds, and a request must be identified by one
dictionary look-up, not by a deliberately slow function per request.

Pure: the text in, a ``ClientTable`` or a ``ClientsError`` naming the field and the fix out.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from events.poolresource import POOL_ATTRIBUTE
from services.runtime.pure.poolref import parse_pool_ref

LEASE = "lease"
"""Acquire leases, and get, renew, report on, rotate and release the client's own."""
READ = "read"
"""List the proxies, and the console."""
ADMIN = "admin"
"""Everything, on every client's leases."""
SCOPES = (LEASE, READ, ADMIN)

HASH_PREFIX = "sha256:"
NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
"""A client's name: it goes into every lease event and into log lines, so it is short and plain."""
MAX_CLIENTS = 10_000
MAX_SELECTORS = 100
MAX_SELECTOR_TEXT = 256
MAX_LEASES = 1_000_000
MAX_FILE_BYTES = 1 << 20
FIELDS = ("name", "token", "scopes", "maxLeases", "selectors")
FIX = 'see docs/api.md, "Clients"'


class ClientsError(ValueError):
    """The clients file cannot be used; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class Client:
    name: str
    scopes: frozenset[str]
    max_leases: int | None = None
    selectors: tuple[Mapping[str, str], ...] = ()
    """An acquire must ask for every pair of at least one of these; empty: any selector."""
    token_hash: str = field(default="", repr=False)

    @property
    def admin(self) -> bool:
        return ADMIN in self.scopes

    def may(self, scope: str) -> bool:
        return self.admin or scope in self.scopes

    def owns(self, client: str) -> bool:
        """Whether a lease acquired by ``client`` is this client's to use."""
        return self.admin or client == self.name

    def allows_selector(self, selector: Mapping[str, str]) -> bool:
        if self.admin or not self.selectors:
            return True
        return any(all(selector.get(k) == v for k, v in s.items()) for s in self.selectors)


OPEN = Client(name="", scopes=frozenset(SCOPES))
"""The caller when the API has no clients at all: everyone, as everything (loudly warned)."""
DEFAULT_CLIENT = "default"
"""The admin client ``DISCOVERY_TOKEN`` stands for."""


def hash_token(token: str) -> str:
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ClientTable:
    by_hash: Mapping[str, Client] = field(default_factory=dict)

    def identify(self, token: str) -> Client | None:
        return self.by_hash.get(hash_token(token))

    @property
    def names(self) -> list[str]:
        return sorted(c.name for c in self.by_hash.values())

    def with_default(self, token: str) -> ClientTable:
        """This table plus ``DISCOVERY_TOKEN``'s admin client."""
        if DEFAULT_CLIENT in self.names:
            raise ClientsError(
                f"a client is named {DEFAULT_CLIENT!r}, the name DISCOVERY_TOKEN's client has; "
                "rename it, or leave DISCOVERY_TOKEN unset and give that client the admin scope"
            )
        default = Client(DEFAULT_CLIENT, frozenset(SCOPES), token_hash=hash_token(token))
        if default.token_hash in self.by_hash:
            raise ClientsError(
                f"client {self.by_hash[default.token_hash].name!r} has DISCOVERY_TOKEN's token; "
                "give it a token of its own"
            )
        return ClientTable({**self.by_hash, default.token_hash: default})


def parse_clients(text: str | bytes, source: str) -> ClientTable:
    """The clients ``source`` (a path, for messages) holds; ``ClientsError`` when it is not a
    clients file this version can use, naming the first problem and its fix."""
    if len(text) > MAX_FILE_BYTES:
        raise ClientsError(f"{source}: over {MAX_FILE_BYTES} bytes; a clients file is small")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClientsError(f"{source}: not YAML ({_first_line(exc)}); {FIX}") from None
    if not isinstance(document, dict) or set(document) != {"clients"}:
        raise ClientsError(f"{source}: expected a mapping with one key, `clients`; {FIX}")
    entries = document["clients"]
    if not isinstance(entries, list) or not entries:
        raise ClientsError(f"{source}: clients: a non-empty list of clients; {FIX}")
    if len(entries) > MAX_CLIENTS:
        raise ClientsError(f"{source}: clients: at most {MAX_CLIENTS} clients")
    by_hash: dict[str, Client] = {}
    names: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{source}: clients[{index}]"
        client = _client(entry, where)
        if client.name in names:
            raise ClientsError(f"{where}.name: {client.name!r} is named twice; names are unique")
        if client.token_hash in by_hash:
            other = by_hash[client.token_hash].name
            raise ClientsError(
                f"{where}.token: the same token as client {other!r}; each client has its own"
            )
        names.add(client.name)
        by_hash[client.token_hash] = client
    return ClientTable(by_hash)


def _client(entry: Any, where: str) -> Client:
    if not isinstance(entry, dict):
        raise ClientsError(f"{where}: a mapping with {', '.join(FIELDS)}")
    for key in entry:
        if key not in FIELDS:
            near = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; the fields are {FIELDS}"
            raise ClientsError(f"{where}: unknown field {str(key)[:40]!r}{hint}")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ClientsError(
            f"{where}.name: 1 to 63 lowercase letters, digits and . _ - (starting and ending "
            "with a letter or digit), e.g. crawler-a"
        )
    return Client(
        name=name,
        scopes=_scopes(entry.get("scopes"), f"{where}.scopes"),
        max_leases=_max_leases(entry.get("maxLeases"), f"{where}.maxLeases"),
        selectors=_selectors(entry.get("selectors", []), f"{where}.selectors"),
        token_hash=_token_hash(entry.get("token"), f"{where}.token"),
    )


def _token_hash(value: Any, where: str) -> str:
    digits = value[len(HASH_PREFIX) :] if isinstance(value, str) else ""
    if (
        isinstance(value, str)
        and value.startswith(HASH_PREFIX)
        and re.fullmatch(r"[0-9a-f]{64}", digits)
    ):
        return value
    # Never quote the value: it may be a token pasted by mistake.
    raise ClientsError(
        f"{where}: `sha256:` and 64 lowercase hex digits, the hash of the client's token, not "
        "the token itself; make it with `egress-proxies clients hash < token-file`"
    )


def _scopes(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not value:
        raise ClientsError(f"{where}: a non-empty list of {', '.join(SCOPES)}")
    for scope in value:
        if scope not in SCOPES:
            raise ClientsError(f"{where}: {str(scope)[:40]!r} is not a scope; use {SCOPES}")
    return frozenset(value)


def _max_leases(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LEASES:
        raise ClientsError(f"{where}: a whole number from 1 to {MAX_LEASES}, or leave it out")
    return int(value)


def _selectors(value: Any, where: str) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_SELECTORS:
        raise ClientsError(f"{where}: a list of at most {MAX_SELECTORS} selectors")
    found = []
    for index, selector in enumerate(value):
        here = f"{where}[{index}]"
        if not isinstance(selector, dict) or not selector:
            raise ClientsError(
                f"{here}: a non-empty mapping of attribute to value, e.g. {{country: de}}"
            )
        for key, text in selector.items():
            if not _text(key) or not _text(text):
                raise ClientsError(
                    f"{here}: keys and values are text of 1 to {MAX_SELECTOR_TEXT} characters "
                    '(quote numbers and booleans: country: "no")'
                )
        found.append(_bound(selector, here))
    return tuple(found)


def _bound(selector: dict[str, str], where: str) -> dict[str, str]:
    """The selector with its ``pool`` as ``NAMESPACE/NAME``: a pool's name is unique only
    within its namespace, so an allowance of ``de`` alone would let the client lease every
    namespace's ``de`` (docs/decisions/0139-the-discovery-api-s-edges.md). ``NAME`` alone is in
    the namespace ``default``, as in a lease request's ``pool``."""
    pool = selector.get(POOL_ATTRIBUTE)
    if pool is None:
        return dict(selector)
    try:
        ref = parse_pool_ref(pool)
    except ValueError as exc:
        raise ClientsError(f"{where}.{POOL_ATTRIBUTE}: {exc}") from None
    return {**selector, POOL_ATTRIBUTE: str(ref)}


def _text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_SELECTOR_TEXT


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
