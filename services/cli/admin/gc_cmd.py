"""``gc run-once [--dry-run]``: one orphan sweep from a shell, shown as a table (or JSON).

For an operator who wants to see what GC would delete before trusting it (``--dry-run`` lists,
deletes nothing, appends nothing), or to clean up now instead of at the next interval. A real run
takes the same lock as the service, so it never sweeps alongside a running GC replica.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from services.cli.common import (
    CliState,
    SweepIncomplete,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.flags import Duration, options, settings_from
from services.cli.pure.render import clean, inert
from services.gc.collector import GarbageCollector
from services.gc.leftovers import LeftoverReport
from services.gc.lock import SweepLock
from services.gc.service import DEFAULT_GRACE
from services.gc.sweep import ProviderReport, SweepReport
from services.providers.base import Provider
from services.providers.config import ProviderSettings, build_providers, load_providers_config
from services.providers.squidauth.secret import (
    SECRET_FILE_ENV,
    SECRET_FILE_NAME,
    master_secret_from_env,
)
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.observability.metrics import Metrics

BUSY = "busy"


def _age(now: datetime, created: datetime) -> str:
    seconds = int((now - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def _results(entry: ProviderReport, dry_run: bool) -> dict[str, str]:
    """What happened to each orphan, by provider id."""
    if dry_run:
        return {i.provider_id: "would delete" for i in entry.orphans}
    out = dict.fromkeys(entry.deleted, "deleted")
    out.update({f.provider_id: f"failed: {f.error_class}: {f.error}" for f in entry.failed})
    return out


def _leftover_results(left: LeftoverReport, dry_run: bool) -> dict[str, str]:
    """What happened to each orphaned leftover, by provider id."""
    if dry_run:
        return {lo.provider_id: "would delete" for lo in left.orphans}
    out = dict.fromkeys(left.deleted, "deleted")
    out.update(dict.fromkeys(left.in_use, "kept: in use again"))
    out.update({f.provider_id: f"failed: {f.error_class}: {f.error}" for f in left.failed})
    return out


def table(report: SweepReport) -> Table:
    """Provider ids, owners and errors come from providers' listings: shown inert."""
    out = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("PROVIDER", "KIND", "INSTANCE", "OWNER", "AGE", "RESULT"):
        out.add_column(column, no_wrap=column != "RESULT")

    def row(*cells: str) -> None:
        out.add_row(*(inert(cell) for cell in cells))

    for entry in report.providers:
        if entry.skipped:
            row(entry.provider, "-", "-", "-", "-", f"skipped: {entry.reason}")
            continue
        results = _results(entry, report.dry_run)
        for instance in entry.orphans:
            row(
                entry.provider,
                "instance",
                instance.provider_id,
                instance.owner_uid,
                _age(report.now, instance.created_at),
                results.get(instance.provider_id, "-"),
            )
        left = entry.leftovers
        if left is None:
            continue
        if left.skipped:
            row(entry.provider, "-", "-", "-", "-", f"leftovers skipped: {left.reason}")
        left_results = _leftover_results(left, report.dry_run)
        for leftover in left.orphans:
            row(
                entry.provider,
                leftover.kind,
                leftover.provider_id,
                leftover.owner_uid,
                _age(report.now, leftover.created_at),
                left_results.get(leftover.provider_id, "-"),
            )
    return out


def summary(report: SweepReport) -> str:
    listed = sum(p.listed for p in report.providers)
    young = sum(p.young for p in report.providers)
    if report.dry_run:
        head = f"would delete {report.orphans} orphans"
    else:
        head = f"deleted {report.deleted} of {report.orphans} orphans ({report.failed} failed)"
    text = (
        f"{head}; {listed} instances listed, {young} spared as younger than the grace, "
        f"{len(report.skipped)} providers skipped"
    )
    if report.leftovers or report.leftovers_skipped:
        done = "would delete" if report.dry_run else f"deleted {report.leftovers_deleted} of"
        text += (
            f"; leftovers: {done} {report.leftovers} ({report.leftovers_failed} failed), "
            f"{len(report.leftovers_skipped)} providers' leftovers skipped"
        )
    return text


def _leftovers_json(left: LeftoverReport | None, dry_run: bool) -> dict[str, object] | None:
    if left is None:
        return None
    results = _leftover_results(left, dry_run)
    return {
        "listed": left.listed,
        "skipped": left.skipped,
        "reason": left.reason,
        "young": left.young,
        "orphans": [
            {
                "providerId": lo.provider_id,
                "kind": lo.kind,
                "ownerUid": lo.owner_uid,
                "createdAt": lo.created_at.isoformat(),
                "result": results.get(lo.provider_id, ""),
            }
            for lo in left.orphans
        ],
        "deleted": len(left.deleted),
        "inUse": len(left.in_use),
        "failed": len(left.failed),
    }


def as_json(report: SweepReport) -> dict[str, object]:
    return {
        "dryRun": report.dry_run,
        "now": report.now.isoformat(),
        "graceSeconds": report.grace,
        "providers": [
            {
                "provider": p.provider,
                "listed": p.listed,
                "skipped": p.skipped,
                "reason": p.reason,
                "young": p.young,
                "orphans": [
                    {
                        "providerId": i.provider_id,
                        "ownerUid": i.owner_uid,
                        "createdAt": i.created_at.isoformat(),
                        "result": _results(p, report.dry_run).get(i.provider_id, ""),
                    }
                    for i in p.orphans
                ],
                "deleted": len(p.deleted),
                "failed": len(p.failed),
                "leftovers": _leftovers_json(p.leftovers, report.dry_run),
            }
            for p in report.providers
        ],
    }


def lease_secret(data_dir: Path) -> bytes | None:
    """The lease secret as ``up`` finds it (docs/decisions/0084-leases-enforced-at-the-proxy.md):
    the environment's, else the one ``up`` keeps in its data directory. Only read, never made: a
    sweep hands no proxy a key, but its providers are built as the executor's are, and without it
    they warn there is none."""
    secret = master_secret_from_env()
    kept = data_dir / SECRET_FILE_NAME
    if secret is None and kept.is_file():
        secret = master_secret_from_env({SECRET_FILE_ENV: str(kept)})
    return secret


def sweep_providers(providers_config: Path | None, data_dir: Path) -> dict[str, Provider]:
    """The named providers, read the way the executor reads them, with ``up``'s secret."""
    entries = load_providers_config(providers_config, default_data_dir=data_dir)
    secret = lease_secret(data_dir) if any(e.enforces_leases for e in entries) else None
    return build_providers(entries, lease_secret=secret)


@click.group("gc")
def gc() -> None:
    """Orphan garbage collection: instances tagged as ours whose proxy is gone, and what
    providers report such instances left behind (leftovers)."""


@gc.command("run-once")
@click.option("--dry-run", is_flag=True, help="Show what would be deleted; delete nothing.")
@click.option(
    "--grace",
    type=Duration(),
    default=f"{int(DEFAULT_GRACE // 60)}m",
    show_default=True,
    help="Spare instances younger than this (creates in flight), e.g. 30s, 10m.",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A table for people, or the sweep results as JSON for tools.",
)
@settings_options()
@click.pass_obj
def run_once(
    state: CliState,
    /,
    *,
    dry_run: bool,
    grace: float,
    output: str,
    nats_url: str | None,
    **flags: Any,
) -> None:
    """Sweep every provider once, instances and the leftovers providers report. Exits 12 if a
    provider (or its leftovers) was skipped, a delete failed, or another sweep held the lock."""
    settings = settings_for(state, nats_url=nats_url)
    found: ProviderSettings = settings_from(ProviderSettings, flags)
    found.apply()
    providers = sweep_providers(found.providers_config, found.data_dir.resolve())

    async def work() -> SweepReport | str:
        conn = await open_connection(settings.nats_url)
        collector = GarbageCollector(
            conn.js,
            JetStreamEventStore(conn.nc, conn.js),
            providers,
            grace=grace,
            lock=SweepLock(conn.js),
            registry=Metrics().registry,
        )
        try:
            return await collector.run_once(dry_run=dry_run) or BUSY
        finally:
            await collector.close()
            await conn.close()
            for provider in providers.values():
                await provider.close()

    report = run_until_signalled(work())
    if report is None:
        return  # stopped by a signal
    if report == BUSY:
        raise SweepIncomplete("another GC sweep holds the lock now; try again shortly")
    assert isinstance(report, SweepReport)
    if output == "json":
        click.echo(json.dumps(as_json(report), indent=2))
    else:
        console = stdout_console()
        if report.orphans or report.skipped or report.leftovers or report.leftovers_skipped:
            console.print(table(report))
        console.print(inert(summary(report)))
    failed = report.failed + report.leftovers_failed
    if report.skipped or report.leftovers_skipped or failed:
        problems = [f"providers skipped: {', '.join(report.skipped)}"] if report.skipped else []
        if report.leftovers_skipped:
            problems.append(f"leftovers skipped: {', '.join(report.leftovers_skipped)}")
        problems += [f"{failed} deletes failed"] if failed else []
        raise SweepIncomplete(clean("; ".join(problems)))


# The same flags as `run executor` / `run gc`, defined once with the provider library.
run_once.params.extend(options(ProviderSettings))
