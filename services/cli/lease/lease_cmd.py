"""``lease acquire|release|report|rotate``: the discovery API from a shell (``lease.holder_cmd``
adds ``renew`` and ``list``).

For scripts (``ID=$(egress-proxies lease acquire -o json | jq -r .id)``) and for an operator
trying a selector by hand. It speaks HTTP to a running discovery service, like a crawler would,
rather than appending to the log itself: the API is where leases are granted, and going around
it would skip its checks. The exit code tells a script what to do next: 6 means try again later
(no proxy free), 7 means the lease is gone (acquire a new one), 8 means no proxy has the asked
attributes at all (fix the selector; retrying will not help).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import click
from rich.console import Console
from rich.table import Table

from services.cli.common import stdout_console
from services.cli.lease.api_client import (
    DiscoveryClient,
    RotationNotDone,
    Unavailable,
    Unexpected,
)
from services.cli.lease.apiaddress import api_options
from services.cli.pure.render import clean, format_time, inert
from services.discovery.http.models import MAX_WAIT_SECONDS
from services.runtime.bearer import token_from_env
from services.runtime.settings.durations import EXAMPLES, parse_duration

OUTCOMES = ("success", "blocked", "failed")


def _client(api_url: str) -> DiscoveryClient:
    return DiscoveryClient(api_url, token_from_env())


def _selector(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{text!r}: write key=value, e.g. country=de")
        out[key.strip()] = value.strip()
    return out


def _ttl(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(clean(exc)) from None
    if seconds <= 0:
        raise click.BadParameter(f"{value!r} must be more than 0; use {EXAMPLES}")
    return seconds


def _wait(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    seconds = _ttl(ctx, param, value)
    if seconds is not None and seconds > MAX_WAIT_SECONDS:
        raise click.BadParameter(f"{value!r} is longer than the most allowed, 60s")
    return seconds


@contextlib.contextmanager
def _waiting(wait: float | None) -> Iterator[None]:
    """A spinner on standard error while the server holds the request (a terminal only)."""
    console = Console(stderr=True)
    if not wait or not console.is_terminal:
        yield
        return
    with console.status(f"waiting up to {wait:g}s for a free proxy"):
        yield


def _emit_json(answer: object) -> None:
    click.echo(json.dumps(answer, indent=2))


@click.group("lease")
def lease() -> None:
    """Acquire, release and report on proxy leases through the discovery API."""


@lease.command("acquire")
@click.option(
    "--selector",
    "-l",
    multiple=True,
    callback=_selector,
    metavar="KEY=VALUE",
    help="An attribute the proxy must have; repeat for more (all must match).",
)
@click.option("--ttl", callback=_ttl, metavar="DURATION", help=f"Lease length ({EXAMPLES}).")
@click.option("--holder", default="", help="Who holds the lease, recorded in the log.")
@click.option(
    "--exclude", multiple=True, metavar="UID", help="A proxy not to be given; repeat for more."
)
@click.option(
    "--proxy",
    "proxy_uid",
    default=None,
    metavar="UID",
    help="This proxy or none (to resume a session on the same IP); exit 6 while it is busy.",
)
@click.option(
    "--target",
    default="",
    metavar="HOST",
    help="The site the proxy is for: proxies it has blocked (in back-off) are not given.",
)
@click.option(
    "--wait",
    callback=_wait,
    metavar="DURATION",
    help="When no proxy is free, wait up to this long (at most 60s) for one.",
)
@click.option(
    "--pool",
    default=None,
    metavar="[NAMESPACE/]NAME",
    help="Lease a member of this pool (NAME alone, or with -n: that namespace's, else "
    "default's); --selector still applies on top.",
)
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="The namespace of a --pool written without one.",
)
@api_options
def acquire(
    *,
    selector: dict[str, str],
    pool: str | None,
    namespace: str | None,
    ttl: float | None,
    holder: str,
    exclude: tuple[str, ...],
    proxy_uid: str | None,
    target: str,
    wait: float | None,
    api_url: str,
    output: str,
) -> None:
    """Lease a free proxy matching every selector; prints its lease id and address."""
    body: dict[str, Any] = {"selector": selector, "holder": holder}
    if pool is not None:
        body["pool"] = _pool_ref(pool, namespace)
    elif namespace is not None:
        raise click.UsageError("-n / --namespace goes with --pool; a selector has no namespace")
    if target:
        body["target"] = target
    if wait:
        body["waitSeconds"] = wait
    if ttl is not None:
        body["ttlSeconds"] = ttl
    if exclude:
        body["exclude"] = list(exclude)
    if proxy_uid is not None:
        body["proxyUid"] = proxy_uid
    # One key for this invocation: the retry below (after an outage answer) can never hold a
    # second proxy, whatever became of the first attempt.
    key = str(uuid.uuid4())
    # The server holds a waiting request open: the connection must outlast the wait.
    client = _client(api_url)
    client = replace(client, timeout=client.timeout + (wait or 0.0))
    with _waiting(wait):
        try:
            answer = client.call("POST", "/v1/leases", body, idempotency_key=key)
        except Unavailable as exc:
            time.sleep(min(exc.retry_after, 5.0))
            answer = client.call("POST", "/v1/leases", body, idempotency_key=key)
    print_lease(answer, output)


def _pool_ref(pool: str, namespace: str | None) -> str:
    """The request's ``pool`` by the CLI's one rule (``NAMESPACE/NAME``, or ``NAME`` with
    ``-n``); the API checks the grammar and answers a 400 naming ``pool``."""
    given, slash, name = pool.rpartition("/")
    if not slash:
        return f"{namespace}/{pool}" if namespace is not None else pool
    if namespace is not None and namespace != given:
        raise click.UsageError(
            f"{clean(pool)!r} names the namespace {clean(given)!r} and -n names "
            f"{clean(namespace)!r}; give one of them"
        )
    return f"{given}/{name}"


def print_lease(answer: Any, output: str) -> None:
    """A lease answer as JSON or as a table of ``key value`` rows."""
    if output == "json":
        _emit_json(answer)
        return
    try:
        rows = _granted_rows(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unexpected(
            f"the discovery API answered a lease this command cannot read ({clean(repr(exc))}); "
            "use -o json to see it"
        ) from None
    _print_rows(rows)


def _print_rows(rows: list[tuple[str, str]]) -> None:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, inert(value))
    stdout_console().print(table)


def _granted_rows(answer: Any) -> list[tuple[str, str]]:
    """The lease as ``key, value`` rows; raises on an answer not shaped like docs/api.md says."""
    proxy = answer["proxy"]
    expires = datetime.fromisoformat(answer["expiresAt"])
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=UTC)
    left = math.ceil((expires - datetime.now(UTC)).total_seconds())
    ttl_note = f"{float(answer['ttlSeconds']):g}s" + (
        " (clamped)" if answer.get("ttlClamped") else ""
    )
    return [
        ("lease", str(answer["id"])),
        ("proxy", f"{proxy.get('namespace', '')}/{proxy.get('name', '')} ({proxy['uid']})"),
        ("url", str(proxy["url"])),
        ("ttl", ttl_note),
        ("expires", f"{format_time(expires)} (in {max(left, 0)}s)"),
        ("fencing token", str(answer["fencingToken"])),
    ]


@lease.command("release")
@click.argument("lease_id", required=False)
@click.option(
    "--holder",
    default=None,
    help="Release every active lease of this holder instead (after a crawler crashed).",
)
@api_options
def release(*, lease_id: str | None, holder: str | None, api_url: str, output: str) -> None:
    """End a lease now (or all of a holder's); each proxy rests for the server's cooldown
    before another client leases it (this client may take it back at once)."""
    if (lease_id is None) == (holder is None):
        raise click.UsageError("name a LEASE_ID or --holder NAME (one of them)")
    if holder is not None:
        answer = _client(api_url).call("DELETE", "/v1/leases?" + urlencode({"holder": holder}))
        released = answer.get("released") if isinstance(answer, dict) else None
        if not isinstance(released, int):
            raise Unexpected("the discovery API answered no count of released leases")
        if output == "json":
            _emit_json({"holder": holder, "released": released})
        else:
            stdout_console().print(inert(f"released {released} lease(s) of {holder}"))
        return
    assert lease_id is not None
    _client(api_url).call("DELETE", f"/v1/leases/{quote(lease_id, safe='')}")
    if output == "json":
        _emit_json({"id": lease_id, "released": True})
    else:
        stdout_console().print(inert(f"lease {lease_id} released"))


@lease.command("report")
@click.argument("lease_id")
@click.option("--outcome", required=True, type=click.Choice(OUTCOMES), help="How it went.")
@click.option("--target", default="", help="What was reached through the proxy (host or URL).")
@click.option("--detail", default="", help="Free text, e.g. 'HTTP 403'.")
@api_options
def report(
    *, lease_id: str, outcome: str, target: str, detail: str, api_url: str, output: str
) -> None:
    """Record how the work through a leased proxy went, while the lease is active."""
    body = {"outcome": outcome, "target": target, "detail": detail}
    _client(api_url).call("POST", f"/v1/leases/{quote(lease_id, safe='')}/report", body)
    if output == "json":
        _emit_json({"id": lease_id, **body})
    else:
        stdout_console().print(inert(f"lease {lease_id}: reported {outcome}"))


ROTATION_OVER = ("completed", "failed", "cancelled")
ROTATION_POLL_SECONDS = 0.5
"""How often ``rotate --wait`` reads the rotation: well inside the reconciler's drain (5 s by
default), after which the old instance is deleted."""


@lease.command("rotate")
@click.argument("lease_id")
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until the lease has switched to the new instance (then print it), or the "
    "rotation failed or was cancelled (exit 11).",
)
@click.option(
    "--timeout",
    callback=_ttl,
    default="5m",
    show_default=True,
    metavar="DURATION",
    help="How long --wait waits (exit 11 after it; running the command again keeps waiting).",
)
@api_options
def rotate(*, lease_id: str, wait: bool, timeout: float, api_url: str, output: str) -> None:
    """Ask for a fresh IP without downtime: a replacement is made and probed first, then the
    lease switches to it (new proxy URL, higher fencing token), then the old instance goes.
    Asking again while a rotation is under way answers that one (exit 7 if the lease ended)."""
    client = _client(api_url)
    path = f"/v1/leases/{quote(lease_id, safe='')}"
    answer = client.call("POST", path + "/rotate")
    if wait:
        answer = _until_over(client, path + "/rotation", answer, timeout)
    _print_rotation(answer, output)
    state = _state(answer)
    if not wait or state == "completed":
        return
    rotation = f"rotation {answer.get('rotationId')}"
    if state in ROTATION_OVER:
        why = f": {answer['message']}" if answer.get("message") else ""
        raise RotationNotDone(f"{rotation} {state}{why}; the lease stays on its instance")
    raise RotationNotDone(
        f"{rotation} still {state} after {timeout:g}s; run the command again to keep waiting "
        "(it answers the rotation under way)"
    )


def _until_over(client: DiscoveryClient, path: str, answer: Any, timeout: float) -> Any:
    """The rotation once it is over, read every ``ROTATION_POLL_SECONDS``; a spinner on a
    terminal says how far it got. A rotation still under way at the timeout is the answer."""
    deadline = time.monotonic() + timeout
    console = Console(stderr=True)
    status = console.status("") if console.is_terminal else contextlib.nullcontext()
    with status as spinner:
        while _state(answer) not in ROTATION_OVER and time.monotonic() < deadline:
            if spinner is not None:
                spinner.update(inert(f"rotation {_state(answer)}; waiting up to {timeout:g}s"))
            time.sleep(min(ROTATION_POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
            try:
                answer = client.call("GET", path)
            except Unavailable as exc:
                time.sleep(min(exc.retry_after, 2.0))
    return answer


def _state(answer: Any) -> str:
    state = answer.get("state") if isinstance(answer, dict) else None
    if not isinstance(state, str):
        raise Unexpected("the discovery API answered a rotation without a state; use -o json")
    return state


def _print_rotation(answer: Any, output: str) -> None:
    if output == "json":
        _emit_json(answer)
        return
    try:
        rows = [
            ("rotation", str(answer["rotationId"])),
            (
                "state",
                str(answer["state"]) + (f" ({answer['message']})" if answer.get("message") else ""),
            ),
            *_granted_rows(answer["lease"]),
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unexpected(
            f"the discovery API answered a rotation this command cannot read "
            f"({clean(repr(exc))}); use -o json to see it"
        ) from None
    _print_rows(rows)
