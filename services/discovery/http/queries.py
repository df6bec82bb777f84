"""What the API reads from a request besides its JSON body: the Idempotency-Key, a lease's
target and the query of ``GET /v1/proxies``. Each is checked strictly, and a bad one is a 400
that names the part and the fix."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC
from typing import Annotated

from litestar.params import QueryParameter

from events.schemas import Phase
from projections.outcomes import target_key
from projections.proxy import ProxyView
from services.discovery.http.errors import ApiError, InvalidRequest
from services.discovery.pure.candidates import EGRESS_ASN, EGRESS_COUNTRY, pairs_of
from services.discovery.pure.egress_shown import COUNTRY_UNKNOWN, asn_filter, country_filter
from services.discovery.pure.errorcodes import ErrorCode
from services.discovery.pure.paging import (
    MAX_LIMIT,
    BadLimit,
    BadToken,
    Key,
    decode_token,
    encode_token,
    page_of,
    parse_limit,
    scope,
    start_after,
)
from services.discovery.pure.policy import Granted

IDEMPOTENCY_KEY = "Idempotency-Key"
MAX_KEY_LENGTH = 255


def checked_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not (key.isascii() and key.isprintable()):
        raise InvalidRequest(
            f"{IDEMPOTENCY_KEY}: use 1 to {MAX_KEY_LENGTH} printable ASCII characters "
            "(a UUID, for instance)"
        )
    return key


def checked_target(target: str) -> str:
    """The host a request's ``target`` names (``outcomes.target_key``), or a 400 naming it."""
    key = target_key(target)
    if target.strip() and not key:
        raise InvalidRequest(
            f"target: {target[:100]!r} names no host; send a host name (shop.example.com) or "
            "a URL of it"
        )
    return key


ATTR_PREFIX = "attr."
PROXY_FILTERS = frozenset({"phase", "healthy"})
PHASES = {phase.value.lower(): phase for phase in Phase}


@dataclass(frozen=True, slots=True)
class ProxyFilter:
    """``GET /v1/proxies``'s query: every given part must match."""

    phase: Phase | None = None
    healthy: bool | None = None
    attributes: tuple[tuple[str, str], ...] = ()
    """Pairs the proxy must carry: its attributes, and ``egress.country``/``egress.asn`` for
    what was seen of its egress (``candidates.pairs_of``, as a lease selector matches)."""

    @property
    def empty(self) -> bool:
        """No filter at all: every proxy matches, and a page needs no scan of the fleet."""
        return self.phase is None and self.healthy is None and not self.attributes

    def matches(self, proxy: ProxyView) -> bool:
        if self.phase is not None and proxy.phase is not self.phase:
            return False
        if self.healthy is not None and proxy.healthy is not self.healthy:
            return False
        if not self.attributes:
            return True
        pairs = pairs_of(proxy)
        return all(pair in pairs for pair in self.attributes)


def _egress_pair(key: str, value: str) -> tuple[str, str]:
    """``egress.country=de`` -> (``egress.country``, ``DE``); ``egress.asn=3320`` -> ``AS3320``:
    as the health service records them, so a lower-case country still finds its proxies."""
    try:
        if key == EGRESS_ASN:
            return key, asn_filter(value, key)
        country = country_filter(value, key)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if country in ("", COUNTRY_UNKNOWN):
        raise InvalidRequest(f"{key}: {value[:40]!r}; write an ISO 3166 alpha-2 code (DE)")
    return key, country


def parse_proxy_filter(query: Iterable[tuple[str, str]]) -> ProxyFilter:
    """``phase=Ready&healthy=true&attr.country=de&egress.country=DE`` -> a filter. An unknown
    parameter is an error, not ignored: a misspelt filter would otherwise answer every proxy."""
    phase: Phase | None = None
    healthy: bool | None = None
    attributes: list[tuple[str, str]] = []
    for key, value in query:
        if key.startswith(ATTR_PREFIX) and len(key) > len(ATTR_PREFIX):
            attributes.append((key[len(ATTR_PREFIX) :], value))
        elif key in (EGRESS_COUNTRY, EGRESS_ASN):
            attributes.append(_egress_pair(key, value))
        elif key == "phase":
            phase = PHASES.get(value.strip().lower())
            if phase is None:
                known = ", ".join(p.value for p in Phase)
                raise InvalidRequest(f"phase: {value!r} is not a phase; use one of {known}")
        elif key == "healthy":
            if value.strip().lower() not in ("true", "false"):
                raise InvalidRequest(f"healthy: {value!r} is not a boolean; use true or false")
            healthy = value.strip().lower() == "true"
        else:
            raise InvalidRequest(
                f"unknown query parameter {key!r}; filter with phase=, healthy=, "
                "attr.<key>=<value>, egress.country=<country> and egress.asn=AS<number>"
            )
    return ProxyFilter(phase, healthy, tuple(attributes))


EgressCountry = Annotated[
    str | None,
    QueryParameter(
        name="egress.country",
        required=False,
        description="Only proxies whose egress was seen in this country (ISO 3166 alpha-2, "
        "DE; any case).",
    ),
]
EgressAsn = Annotated[
    str | None,
    QueryParameter(
        name="egress.asn",
        required=False,
        description="Only proxies whose egress was seen in this autonomous system (AS3320).",
    ),
]
"""``GET /v1/proxies``'s egress filters as the OpenAPI document names them (read with the
rest of the query by ``parse_proxy_filter``)."""


def lease_key(granted: Granted) -> Key:
    """A lease's place in a holder's listing, oldest first: its grant's time (fixed width, so
    the text sorts as the time does) and its id."""
    record = granted.record
    return (f"{record.acquired_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}", record.lease_id)


class InvalidContinue(ApiError):
    """A ``continue`` token that does not decode or belongs to other filters: the listing has
    to start again (a token is never guessed into a page of the wrong rows)."""

    code = ErrorCode.INVALID_CONTINUE


PAGING = frozenset({"limit", "continue"})


@dataclass(frozen=True, slots=True)
class Paging:
    """``limit`` and ``continue`` of a listing's query (docs/api.md "Paging",
    docs/decisions/0132-listings-page-by-key-as-kubernetes.md)."""

    limit: int | None
    after: Key | None
    where: str
    """The listing and its filters, as its tokens name them."""

    def page(self, keys: Sequence[Key], matches: Callable[[Key], bool] | None = None) -> Paged:
        """The page of ``keys`` (sorted) after the token's key, of those ``matches`` keeps."""
        kept = keys if matches is None else [k for k in keys if matches(k)]
        start = start_after(kept, self.after)
        end = len(kept) if self.limit is None else start + self.limit
        shown = kept[start:end]
        more = end < len(kept) and bool(shown)
        return Paged(list(shown), encode_token(self.where, shown[-1]) if more else "", len(kept))

    def page_of(
        self, keys: Sequence[Key], found: AbstractSet[str], key_of: Mapping[str, Key]
    ) -> Paged:
        """The page of ``keys`` (sorted, uid last) whose uids are ``found``: what ``page``
        answers with a filter, without a walk of ``keys`` (``paging.page_of``)."""
        shown, more = page_of(keys, found, key_of, self.after, self.limit)
        return Paged(shown, encode_token(self.where, shown[-1]) if more else "", len(found))


@dataclass(frozen=True, slots=True)
class Paged:
    keys: list[Key]
    token: str
    total: int


def parse_paging(
    query: Iterable[tuple[str, str]], listing: str, width: int
) -> tuple[Paging, list[tuple[str, str]]]:
    """The paging parameters and the rest of the query (the filters, which the token is bound
    to). A repeated ``limit`` or ``continue`` is refused rather than one of them chosen."""
    pairs = list(query)
    rest = [(k, v) for k, v in pairs if k not in PAGING]
    limits = [v for k, v in pairs if k == "limit"]
    tokens = [v for k, v in pairs if k == "continue"]
    for name, sent in (("limit", limits), ("continue", tokens)):
        if len(sent) > 1:
            raise InvalidRequest(f"{name}: sent {len(sent)} times; send it once")
    try:
        limit = parse_limit(limits[0] if limits else None)
    except BadLimit as exc:
        raise InvalidRequest(str(exc)) from None
    where = scope(listing, rest)
    after = None
    if tokens and tokens[0]:
        try:
            after = decode_token(tokens[0], where, width)
        except BadToken as exc:
            raise InvalidContinue(str(exc)) from None
    return Paging(limit, after, where), rest


Limit = Annotated[
    str | None,
    QueryParameter(
        name="limit",
        required=False,
        description=f"At most this many rows (1 to {MAX_LIMIT}); the answer's continue "
        "fetches the next page. Absent: every row (a client should page).",
    ),
]
Continue = Annotated[
    str | None,
    QueryParameter(
        name="continue",
        required=False,
        description="The previous page's continue, with the same filters: the next page.",
    ),
]
