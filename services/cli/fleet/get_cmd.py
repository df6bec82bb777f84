"""``get``: the proxies with their phase, address, health and lease, rebuilt from the log
(``get pools``: the pools, ``pools_cmd``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import click
import msgspec
import yaml
from nats.js import JetStreamContext
from rich.table import Table
from rich.text import Text

from events.errors import StoreUnavailable
from events.poolresource import POOL_ATTRIBUTE
from events.store import Recorded
from events.subjects import LEASE_STREAM, METER_STREAM
from projections import lease as lease_fold
from projections import lease_queries, meter
from projections.lease import LeaseView
from projections.meter import Bytes, MeterView
from projections.proxy import ProxyView
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.flags import options
from services.cli.fleet import pools_cmd
from services.cli.fleet.proxyviews import listed as listed_proxies
from services.cli.log.timetravel import as_of, instant_option
from services.cli.pure.render import format_time, human_bytes, inert
from services.cli.pure.selector import matches, parse_selector
from services.discovery.pure.candidates import pairs_of
from services.discovery.pure.egress_shown import EgressShown, index_of, shown_in
from services.runtime.eventlog.projector import Projector
from services.runtime.settings.egress import PolicySettings, policy_from
from services.runtime.settings.errors import ConfigError


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A proxy's lease as ``get`` shows it, at the moment of the listing."""

    lease_id: str | None = None
    holder: str = ""
    cooldown_until: datetime | None = None

    @classmethod
    def of(cls, view: LeaseView | None, now: datetime) -> LeaseState:
        if not lease_queries.is_free(view, now):
            assert view is not None
            return cls(view.lease_id, view.holder)
        rest = lease_queries.available_at(view)
        return cls(cooldown_until=rest if rest is not None and rest > now else None)

    def leased_cell(self) -> Text:
        return inert("no" if self.lease_id is None else (self.holder or "yes"))

    def cooldown_cell(self, now: datetime) -> str:
        if self.cooldown_until is None:
            return "-"
        return f"{math.ceil((self.cooldown_until - now).total_seconds())}s"


def egress_item(found: EgressShown | None) -> dict[str, object] | None:
    """The egress as ``GET /v1/proxies`` shows it (docs/api.md), for ``-o json|yaml``; its time
    as the other times here are written."""
    if found is None:
        return None
    out: dict[str, object] = msgspec.to_builtins(found)
    out["checkedAt"] = format_time(found.checked_at) if found.checked_at else None
    return out


def item(
    view: ProxyView, lease: LeaseState, egress: EgressShown | None = None
) -> dict[str, object]:
    return {
        "uid": view.uid,
        "namespace": view.namespace,
        "name": view.name,
        "phase": view.phase.value,
        "reason": view.reason,
        "message": view.message,
        "ip": view.ip,
        "url": view.url,
        "provider": view.spec.provider,
        "providerID": view.provider_id,
        "healthy": view.healthy,
        "healthMessage": view.health_message,
        "attributes": dict(view.spec.attributes),
        "generation": view.generation,
        "observedGeneration": view.observed_generation,
        "conditions": msgspec.to_builtins(view.conditions),
        "leased": lease.lease_id is not None,
        "leaseId": lease.lease_id,
        "cooldownUntil": format_time(lease.cooldown_until) if lease.cooldown_until else None,
        "egress": egress_item(egress),
        "egressReplacements": view.egress_replacements,
    }


def age(view: ProxyView, now: datetime) -> str:
    if view.created_at is None:
        return "-"
    seconds = int((now - view.created_at).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


Listed = list[tuple[ProxyView, LeaseState]]


def health_cell(view: ProxyView) -> str:
    return "-" if view.healthy is None else ("healthy" if view.healthy else "unhealthy")


def egress_cell(found: EgressShown | None) -> str:
    """The address sites see, marked ``!mismatch`` (``!unchecked``, ``!shared``) when its egress
    keeps the proxy from being leased or another proxy leaves through it too."""
    if found is None:
        return "-"
    text = found.ip or "-"
    return f"{text} !{found.flag}" if found.flag else text


def place_cell(found: EgressShown | None) -> str:
    return found.place if found is not None else "-"


def bytes_cell(moved: Bytes | None, spent: bool = False) -> str:
    """An upstream proxy's bytes of today, ``↑`` up and ``↓`` down, ``!budget`` once its
    provider's budget is spent (D162); ``-`` before its first byte of the day."""
    text = "-"
    if moved is not None and moved.total:
        text = f"↑{human_bytes(moved.up)} ↓{human_bytes(moved.down)}"
    return f"{text} !budget" if spent else text


def table(
    listed: Listed,
    now: datetime,
    *,
    wide: bool = False,
    egress: Mapping[str, EgressShown | None] | None = None,
    meters: Mapping[str, MeterView] | None = None,
) -> Table:
    """``egress``: uid -> its egress (``egress_shown``), shown by ``wide``; ``meters``: the
    upstream providers' meter views (``projections.meter``), whose bytes of ``now``'s day
    ``wide`` shows."""
    out = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["NAMESPACE", "NAME", "PHASE", "IP", "PROVIDER", "HEALTH", "LEASED", "COOLDOWN"]
    columns += ["AGE", "EGRESS", "COUNTRY/ASN", "BYTES", "UID", "MESSAGE"] if wide else ["AGE"]
    today = meter.day_of(now)
    found = egress or {}
    for column in columns:
        out.add_column(column, no_wrap=column != "MESSAGE", overflow="fold")
    for view, lease in listed:
        row: list[Text | str] = [
            inert(view.namespace),
            inert(view.name),
            inert(view.phase.value),
            inert(view.ip or "-"),
            inert(view.spec.provider or "-"),
            health_cell(view),
            lease.leased_cell(),
            lease.cooldown_cell(now),
            age(view, now),
        ]
        if wide:
            shown = found.get(view.uid)
            row += [inert(egress_cell(shown)), inert(place_cell(shown))]
            gauge = (meters or {}).get(view.spec.provider)
            moved = meter.bytes_on(gauge, view.uid, today)
            row.append(inert(bytes_cell(moved, meter.spent(gauge, now) is not None)))
            row += [inert(view.uid), inert(_message(view) or "-")]
        out.add_row(*row)
    return out


def _message(view: ProxyView) -> str:
    """What most explains the proxy's state: why it is unhealthy, else its phase's message."""
    if view.healthy is False and view.health_message:
        return view.health_message
    return view.message


PROXY_KINDS = ("proxies", "proxy", "px")


def _kind(ctx: click.Context, param: click.Parameter, value: str) -> str:
    del ctx, param
    kind = value.lower()
    if kind in PROXY_KINDS:
        return "proxies"
    if pools_cmd.pool_kind(kind):
        return "pools"
    raise click.BadParameter(f"{value!r}: write proxies (the default) or pools")


def _selector(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    del ctx, param
    try:
        return parse_selector(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("get")
@click.argument("kind", metavar="[proxies|pools]", default="proxies", callback=_kind)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json", "yaml"]),
    default="table",
    show_default=True,
    help="table for people; wide adds the egress (what sites see, `!mismatch` when it does not "
    "match), its country and AS, an upstream proxy's bytes of today (`!budget` once its "
    "provider's daily budget is spent), the UID (for `events --proxy`) and the last message (why a "
    "proxy is unhealthy or failed); json or yaml for tools.",
)
@click.option("-n", "--namespace", help="Only this namespace.")
@click.option(
    "-l",
    "--selector",
    multiple=True,
    callback=_selector,
    metavar="KEY=VALUE[,KEY=VALUE]",
    help="Only proxies whose attributes match every KEY=VALUE; repeat -l for more. A pool's "
    f"members: -l {POOL_ATTRIBUTE}=NAME. What sites see: -l egress.country=DE, "
    "-l egress.asn=AS3320.",
)
@click.option(
    "--at",
    "at",
    metavar="TIME",
    callback=instant_option,
    help="Show the fleet as it was at TIME (ISO 8601, e.g. 2026-03-01T14:30:00Z; no zone: "
    "UTC), folding the log up to then.",
)
@settings_options()
@click.pass_obj
def get_cmd(
    state: CliState,
    *,
    kind: str,
    output: str,
    namespace: str | None,
    selector: dict[str, str],
    at: datetime | None,
    nats_url: str | None,
    egress_country_attribute: str = "",
    egress_required: bool = False,
    unique_egress: bool = False,
) -> None:
    """List proxies with their phase, address, health and lease (views rebuilt from the log);
    `get pools`: the pools with their members' figures."""
    if kind == "pools":
        if selector:
            raise click.UsageError("-l selects proxies by attribute; `get pools` lists every pool")
        pools_cmd.show_pools(state, output=output, namespace=namespace, at=at, nats_url=nats_url)
        return
    settings = settings_for(state, nats_url=nats_url)
    try:
        policy = policy_from(egress_country_attribute, egress_required, unique_egress)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None

    async def work() -> tuple[list[ProxyView], dict[str, LeaseView], dict[str, MeterView]]:
        # Every namespace is read: a proxy may share its address with one in another.
        conn = await open_connection(settings.nats_url)
        try:
            meters = await read_meters(conn.js, at) if output == "wide" else {}
            if at is not None:
                return (*await as_of(conn, None, at), meters)
            views = await listed_proxies(conn, None)
            leases: Projector[LeaseView] = Projector(
                conn.js, LEASE_STREAM, "lease.*", lease_fold.apply
            )
            await leases.catch_up()
            await leases.close()
        finally:
            await conn.close()
        return views, leases.views, meters

    every, leases, meters = run_until_signalled(work()) or ([], {}, {})
    index = index_of(every)
    views = [v for v in every if not namespace or v.namespace == namespace]
    views = [v for v in views if matches(dict(pairs_of(v)), selector)]
    now = at or datetime.now(UTC)
    listed = [(v, LeaseState.of(leases.get(v.uid), now)) for v in views]
    egress = {v.uid: shown_in(v, policy, index) for v in views}
    items = [item(v, lease, egress[v.uid]) for v, lease in listed]
    if output == "json":
        click.echo(json.dumps({"items": items}, indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump({"items": items}, sort_keys=False))
    elif not listed:
        where = f" in namespace {namespace}" if namespace else ""
        where += (
            " matching " + ",".join(f"{k}={v}" for k, v in selector.items()) if selector else ""
        )
        where += f" at {format_time(at)}" if at else ""
        stdout_console().print(inert(f"No proxies{where}."))
    else:
        wide = output == "wide"
        stdout_console().print(table(listed, now, wide=wide, egress=egress, meters=meters))


async def read_meters(js: JetStreamContext, at: datetime | None) -> dict[str, MeterView]:
    """The upstream providers' meter views (``projections.meter``), of the records stored up to
    ``at`` if given. A store without the METER stream has none to show."""

    def apply(view: MeterView | None, recorded: Recorded) -> MeterView:
        if at is not None and recorded.timestamp > at:
            return view or MeterView(provider=meter.provider_of(recorded.subject))
        return meter.apply(view, recorded)

    gauges = Projector(js, METER_STREAM, "meter.*", apply, key=meter.provider_of)
    try:
        await gauges.catch_up()
    except StoreUnavailable:
        return {}
    finally:
        await gauges.close()
    return gauges.views


# Discovery's own flags (and variables), so that -o wide marks what discovery does not lease.
get_cmd.params.extend(options(PolicySettings))
