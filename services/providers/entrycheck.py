"""Every entry of a providers config asked at once whether it would work: what
``egress-proxies providers check`` prints and what the executor logs at start-up
(docs/decisions/0144-the-preflight-command-and-the-start-up-check.md).

Each entry gets a provider built for the check alone, unwrapped (``build_unwrapped``), and
closed after it. Entries are checked concurrently, at most ``CONCURRENCY`` at a time, each within
its own timeout, and one entry's failure, whatever it is, becomes that entry's finding: a bug in
one cloud's preflight never hides what the others answered. A config that cannot be built at all
(a ``ConfigError``) is not a finding: it is raised before any cloud is asked, as ``up`` would
refuse it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from services.providers.base import Provider
from services.providers.config import ProviderEntry, build_unwrapped
from services.providers.preflight import TIMEOUT, Finding, Preflight, failed, run_preflight

log = structlog.get_logger("egress.providers")

CONCURRENCY = 8
"""Entries asked at once: each cloud is asked a handful of read-only calls, and a config has a
few entries, so eight leaves a long config at most a few timeouts long without opening dozens of
clients at once."""

BUG_FIX = "a bug in this provider type's preflight: report it with the logged traceback"
NO_FINDINGS = "the provider answered no findings"


@dataclass(frozen=True, slots=True)
class EntryFindings:
    """One entry's answer: its name and type, and what its preflight found (never empty);
    ``asked`` is false for a type with no preflight (nothing was asked of any cloud)."""

    name: str
    type: str
    findings: list[Finding]
    asked: bool = True

    @property
    def failed(self) -> list[Finding]:
        return failed(self.findings)


async def check_entries(
    entries: Sequence[ProviderEntry],
    *,
    timeout: float = TIMEOUT,
    concurrency: int = CONCURRENCY,
    on_done: Callable[[EntryFindings], None] | None = None,
) -> list[EntryFindings]:
    """The findings of every entry, in the config's order. ``on_done`` hears each entry as it
    ends (a progress display). Raises ``ConfigError`` for an entry that cannot be built, after
    closing the ones built before it."""
    built: list[tuple[ProviderEntry, Provider]] = []
    try:
        for index, entry in enumerate(entries):
            built.append((entry, build_unwrapped(entry, index)))
        gate = asyncio.Semaphore(concurrency)

        async def one(entry: ProviderEntry, provider: Provider) -> EntryFindings:
            async with gate:
                findings = await _guarded(entry, provider, timeout)
                asked = isinstance(provider, Preflight)
                result = EntryFindings(entry.name, entry.type, findings, asked)
            if on_done is not None:
                on_done(result)
            return result

        return list(await asyncio.gather(*(one(e, p) for e, p in built)))
    finally:
        for entry, provider in built:
            await _close(entry, provider)


async def _guarded(entry: ProviderEntry, provider: Provider, timeout: float) -> list[Finding]:
    try:
        # run_preflight turns a timeout and a ProviderError into a finding; anything else
        # reaching here is a bug in that provider's preflight, kept to its own entry.
        findings = await run_preflight(provider, timeout)
    except Exception as exc:
        log.exception("preflight raised", provider=entry.name, type=entry.type)
        return [Finding("preflight", False, f"{type(exc).__name__}: {exc}", BUG_FIX)]
    return findings or [Finding("preflight", True, NO_FINDINGS)]


async def _close(entry: ProviderEntry, provider: Provider) -> None:
    try:
        await provider.close()
    except Exception as exc:
        # Checked already: a failing close costs a warning, never the answers.
        log.warning("provider close failed", provider=entry.name, error=f"{exc!r}")


async def log_at_start(
    entries: Sequence[ProviderEntry], *, timeout: float = TIMEOUT
) -> list[EntryFindings]:
    """The executor's start-up check: each failing finding logged as a warning with its fix,
    each passing entry as one info line, as each entry answers (a slow cloud holds back only its
    own lines). It never raises (bar cancellation): a cloud that cannot answer, or a config
    edited since start-up, must not stop the local fleet."""
    try:
        return await check_entries(entries, timeout=timeout, on_done=_log_entry)
    except Exception as exc:
        log.warning(
            "preflight could not run",
            error=f"{type(exc).__name__}: {exc}",
            fix="run `egress-proxies providers check` with the same --providers-config",
        )
        return []


def _log_entry(result: EntryFindings) -> None:
    for finding in result.failed:
        log.warning(
            "preflight: this provider entry would fail",
            provider=result.name,
            type=result.type,
            check=finding.check,
            detail=finding.detail,
            fix=finding.fix,
        )
    if not result.asked:
        log.debug("no preflight for this provider type", provider=result.name, type=result.type)
    elif not result.failed:
        log.info(
            "preflight passed", provider=result.name, type=result.type, checks=len(result.findings)
        )
