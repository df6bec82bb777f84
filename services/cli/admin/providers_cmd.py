"""``providers check``: whether every entry of a providers config would work, asked of its cloud
before anything is created (docs/decisions/0144-the-preflight-command-and-the-start-up-check.md).

Users meet a cloud's refusals late otherwise, at whatever hour a pool scales: a size not offered
in a region, credentials without the right to create. The command builds each entry's provider as
the executor would (without the wrappers, which play no part in what a cloud answers), runs its
preflight (services/providers/preflight.py) and prints one row per finding with its fix. Nothing
here needs NATS: it runs where the config is written, before ``up``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Console
from rich.status import Status
from rich.table import Table

from services.cli.common import Unfinished, run_until_signalled, stdout_console
from services.cli.flags import options, settings_from
from services.cli.pure.render import clean, inert, json_text
from services.providers.config import ProviderSettings, load_providers_config
from services.providers.entrycheck import EntryFindings, check_entries
from services.providers.preflight import TIMEOUT, Finding

EXIT_WOULD_FAIL = 14
"""``providers check``: an entry would fail; the table (and the error) names it and the fix."""
COLUMNS = ("ENTRY", "TYPE", "CHECK", "VERDICT", "DETAIL", "FIX")


class WouldFail(Unfinished):
    exit_code = EXIT_WOULD_FAIL


@click.group("providers")
def providers() -> None:
    """The provider entries of a providers config (--providers-config)."""


@providers.command("check")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A table for people, or every entry's findings as JSON for tools.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=TIMEOUT,
    show_default=True,
    help="Seconds one entry's checks may take, all its calls together; past it the entry "
    "fails with a finding saying its API did not answer.",
)
def check(output: str, timeout: float, **flags: Any) -> None:
    """Ask each entry's cloud, without creating anything, whether it would work: credentials
    and permissions, image, size in each region or zone, quota headroom, firewall rules.

    Exits 0 when every entry would work, 14 when a finding fails (the FIX column says what to
    change), 2 for a config that cannot be read. Types without a cloud to ask (local, fake)
    answer that there is nothing to check.
    """
    found: ProviderSettings = settings_from(ProviderSettings, flags)
    found.apply()
    entries = load_providers_config(
        found.providers_config, default_data_dir=found.data_dir.resolve()
    )
    finished: list[str] = []
    with _spinner(len(entries)) as status:

        def done(result: EntryFindings) -> None:
            finished.append(result.name)
            if status is not None:
                status.update(_progress(len(finished), len(entries)))

        results = run_until_signalled(check_entries(entries, timeout=timeout, on_done=done))
    if results is None:
        return  # stopped by a signal
    if output == "json":
        click.echo(json_text(as_json(results), indent=2))
    else:
        console = stdout_console()
        console.print(table(results))
        console.print(inert(summary(results)))
    failing = [r for r in results if r.failed]
    if failing:
        raise WouldFail(clean(would_fail(failing)))


# The providers flags of `run executor` / `run gc`, defined once with the provider library.
check.params.extend(options(ProviderSettings))


@contextlib.contextmanager
def _spinner(total: int) -> Iterator[Status | None]:
    """A spinner on standard error while the clouds answer (a terminal only: a script reading
    the output gets none of it)."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with console.status(_progress(0, total)) as status:
        yield status


def _progress(done: int, total: int) -> str:
    return f"asking the providers: {done} of {total} entries answered"


def table(results: list[EntryFindings]) -> Table:
    """Details and fixes quote the clouds' answers: shown inert."""
    out = Table(box=None, pad_edge=False, header_style="bold")
    for column in COLUMNS:
        out.add_column(column, overflow="fold", no_wrap=column not in ("DETAIL", "FIX"))
    for result in results:
        for finding in result.findings:
            verdict = inert("ok", "green") if finding.ok else inert("fails", "red")
            out.add_row(
                inert(result.name),
                inert(result.type),
                inert(finding.check),
                verdict,
                inert(finding.detail),
                inert(finding.fix or "-"),
            )
    return out


def summary(results: list[EntryFindings]) -> str:
    failing = sum(1 for r in results if r.failed)
    checked = f"{len(results)} {'entry' if len(results) == 1 else 'entries'} checked"
    if not failing:
        return f"{checked}: every one would work"
    return f"{checked}: {failing} would fail"


def would_fail(failing: list[EntryFindings]) -> str:
    """The last line: each failing entry with the checks that failed."""
    named = "; ".join(f"{r.name} ({', '.join(f.check for f in r.failed)})" for r in failing)
    return f"these provider entries would fail: {named}; the FIX column says what to change"


def _finding_json(finding: Finding) -> dict[str, object]:
    return {"check": finding.check, "ok": finding.ok, "detail": finding.detail, "fix": finding.fix}


def as_json(results: list[EntryFindings]) -> dict[str, object]:
    return {
        "ok": not any(r.failed for r in results),
        "entries": [
            {
                "name": r.name,
                "type": r.type,
                "ok": not r.failed,
                "findings": [_finding_json(f) for f in r.findings],
            }
            for r in results
        ],
    }
