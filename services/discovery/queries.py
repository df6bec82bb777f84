"""What the API reads from a request besides its JSON body: the Idempotency-Key, a lease's
target and the query of ``GET /v1/proxies``. Each is checked strictly, and a bad one is a 400
that names the part and the fix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from events.schemas import Phase
from projections.outcomes import target_key
from projections.proxy import ProxyView
from services.discovery.errors import InvalidRequest

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

    def matches(self, proxy: ProxyView) -> bool:
        if self.phase is not None and proxy.phase is not self.phase:
            return False
        if self.healthy is not None and proxy.healthy is not self.healthy:
            return False
        attributes = proxy.spec.attributes
        return all(attributes.get(key) == value for key, value in self.attributes)


def parse_proxy_filter(query: Iterable[tuple[str, str]]) -> ProxyFilter:
    """``phase=Ready&healthy=true&attr.country=de`` -> a filter. An unknown parameter is an
    error, not ignored: a misspelt filter would otherwise answer every proxy."""
    phase: Phase | None = None
    healthy: bool | None = None
    attributes: list[tuple[str, str]] = []
    for key, value in query:
        if key.startswith(ATTR_PREFIX) and len(key) > len(ATTR_PREFIX):
            attributes.append((key[len(ATTR_PREFIX) :], value))
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
                f"unknown query parameter {key!r}; filter with phase=, healthy= and "
                "attr.<key>=<value>"
            )
    return ProxyFilter(phase, healthy, tuple(attributes))
