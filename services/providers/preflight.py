"""A provider entry checked against its cloud before it costs anything: the preflight.

Users meet a cloud's refusals late otherwise: a size not offered in a region, an image that
ignores the user data, credentials without the right to create, all found by the first create,
at whatever hour a pool scales. A provider that can ask its cloud (without creating anything)
implements ``Preflight``; ``egress-proxies providers check`` and ``up`` run it for every entry.

A preflight is read-only and answers a list of ``Finding``: one per thing checked, each saying
what was found and, when it would fail, the fix. It never raises for what it finds; a call that
could not be made at all (no route, a timeout) is a finding too, so one broken entry never hides
the others' answers. It is run on a provider built for it alone, unwrapped: the lease key and the
instruments of ``build_providers`` play no part in what a cloud answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from services.providers.base import Provider, ProviderError

TIMEOUT = 60.0
"""Seconds one entry's preflight may take, all its calls together."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing checked. ``check`` names it (``credentials``, ``image``, ``size in fsn1``,
    ``quota``, ``firewall``), ``detail`` says what the cloud answered, ``fix`` what to change
    when ``ok`` is false (empty otherwise)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


@runtime_checkable
class Preflight(Protocol):
    """An optional capability of a provider, checked with ``isinstance``."""

    async def preflight(self) -> list[Finding]:
        """Every check of this entry against its cloud, read-only. Never raises for what it
        finds: a refusal is a ``Finding`` with ``ok`` false and its fix."""
        ...


async def run_preflight(provider: Provider, timeout: float = TIMEOUT) -> list[Finding]:
    """``provider``'s findings; one finding saying so for a provider with nothing to check, and
    one naming the error for a preflight that failed as a whole (a bug, an unreachable API)."""
    if not isinstance(provider, Preflight):
        return [Finding("preflight", True, f"nothing to check for type {provider.type}")]
    try:
        async with asyncio.timeout(timeout):
            return await provider.preflight()
    except TimeoutError:
        return [
            Finding(
                "preflight",
                False,
                f"no answer within {timeout:g} s",
                "check that this machine reaches the provider's API (proxy, firewall, endpoint)",
            )
        ]
    except ProviderError as exc:
        return [Finding("preflight", False, f"{type(exc).__name__}: {exc}", "see the detail")]


def failed(findings: Sequence[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]
