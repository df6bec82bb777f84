"""``lease renew``, ``lease list --holder`` and ``lease release --holder``: keeping and finding your
own leases from a shell.

A crawl that runs longer than its lease renews rather than re-acquiring (a new lease may be a new
IP, which breaks a cookie session); a crawler that crashed finds and frees what it held by its
holder name instead of waiting for the TTLs to run out. Registered on the ``lease`` group by
``services.cli.main`` importing it, beside ``lease_cmd``'s acquire/release/report.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import click
from rich.table import Table

from services.cli.common import stdout_console
from services.cli.lease.api_client import Unexpected
from services.cli.lease.apiaddress import api_options
from services.cli.lease.lease_cmd import (
    _client,
    _emit_json,
    _ttl,
    lease,
    print_lease,
)
from services.cli.pure.render import clean, format_time, inert

HOLDER_HELP = "The holder name the leases were acquired with (acquire --holder)."


@lease.command("renew")
@click.argument("lease_id")
@click.option(
    "--ttl",
    callback=_ttl,
    metavar="DURATION",
    help="How long from now the lease lasts (default: the server's default TTL).",
)
@api_options
def renew(*, lease_id: str, ttl: float | None, api_url: str, output: str) -> None:
    """Extend an active lease from now; same proxy, same fencing token (exit 7 if it ended)."""
    body: dict[str, Any] = {} if ttl is None else {"ttlSeconds": ttl}
    answer = _client(api_url).call("PATCH", f"/v1/leases/{quote(lease_id, safe='')}", body)
    print_lease(answer, output)


@lease.command("list")
@click.option("--holder", required=True, help=HOLDER_HELP)
@api_options
def list_leases(*, holder: str, api_url: str, output: str) -> None:
    """The holder's active leases, oldest first."""
    answer = _client(api_url).call("GET", "/v1/leases?" + urlencode({"holder": holder}))
    if output == "json":
        _emit_json(answer)
        return
    try:
        items = list(answer["items"])
        rows = [
            (
                str(item["id"]),
                str(item["proxy"]["uid"]),
                str(item["proxy"]["url"]),
                format_time(_when(item["expiresAt"])),
                str(item["fencingToken"]),
            )
            for item in items
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise Unexpected(
            f"the discovery API answered a listing this command cannot read ({clean(repr(exc))}); "
            "use -o json to see it"
        ) from None
    console = stdout_console()
    if not rows:
        console.print(inert(f"no active lease for {holder}"))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("LEASE", "PROXY", "EXPIRES", "TOKEN"):
        table.add_column(column, overflow="fold")
    for lease_id, proxy, _, expires, token in rows:
        table.add_row(*(inert(cell) for cell in (lease_id, proxy, expires, token)))
    console.print(table)
    # The URL whole, on a line of its own: a table column would cut it ("…") or fold it across
    # lines, and it is what a reader copies (docs/decisions/0147-the-cli-as-one-language.md).
    for lease_id, _, url, _, _ in rows:
        console.print(inert(f"{lease_id}  {url}"), soft_wrap=True, crop=False)


def _when(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
