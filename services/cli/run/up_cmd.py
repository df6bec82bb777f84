"""``up`` (everything in one process) and ``run NAME`` (one service, for deployments).

Both read the registry when a command line is parsed, not when this module is imported, so a
service added to ``SERVICES`` gets its sub-command and its flags without any change here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import click
import msgspec
import structlog
from click.core import ParameterSource
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from services.cli.common import (
    EVENT_LOOP_ATTRS,
    CliState,
    attach,
    probe,
    run_until_signalled,
    setting_params,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.envoptions import env_option, with_env_option
from services.cli.flags import option, settings_from
from services.cli.lease import apiaddress
from services.cli.pure.render import inert
from services.cli.run import uplocal
from services.cli.run.registry import SERVICES, ServiceEntry, known_names, option_names
from services.providers.config import load_providers_config
from services.providers.squidauth.secret import SECRET_ENV, SECRET_FILE_ENV, ensure_secret_file
from services.runtime.datadir import DataDirBusy, exclusive
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.stale import StoreInUse, refuse_foreign, stop_leftovers
from services.runtime.ports import free_port
from services.runtime.service import Service, Started, run_services
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import field_named
from services.runtime.version import VERSION

log = structlog.get_logger("egress.cli")

DEFAULT_NATS_PORT = 4222
DEFAULT_METRICS_PORT = 9464
DEFAULT_API_PORT = 8080
DISCOVERY = "discovery"
EXECUTOR = "executor"
GATEWAY = "gateway"
LEASE_SERVICES = (EXECUTOR, DISCOVERY, "health")
"""The services that need the lease secret."""


def metrics_port_option() -> click.Option:
    """``--metrics-port`` of ``up`` and ``run``: the long-running commands serve /metrics unless
    told not to, where every other command (and ``Settings``) has it off."""
    return option(field_named(Settings, "metrics_port"), default=DEFAULT_METRICS_PORT)


def build(entry: ServiceEntry, settings: Settings, values: dict[str, Any]) -> Service:
    flags: dict[str, Any] = {}
    for name in option_names(entry):
        # An option of `up` under another name feeds it; `run NAME` has the option itself.
        shared = entry.up_name(name)
        flags[name] = values[shared] if shared in values else values[name]
    return entry.factory(settings, settings_from(entry.settings, flags))


# ------------------------------------------------------------------------------------------ up


class UpCommand(click.Command):
    """``up`` plus the options of every registered service, each once however many share it."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        seen = {p.name for p in params}
        extra: list[click.Parameter] = []
        for entry in SERVICES.values():
            if entry.up_optional:
                extra.append(_with_option(entry))
            for opt in entry.options:
                if opt.name is None or entry.up_name(opt.name) in seen:
                    continue
                seen.add(opt.name)
                extra.append(opt)
        # Keep --help last, where click puts it.
        return [*params[:-1], *extra, params[-1]]


def _with_option(entry: ServiceEntry) -> click.Option:
    return click.Option(
        [f"--with-{entry.name}"],
        is_flag=True,
        default=False,
        help=f"Also run the {entry.name} service (off by default). {entry.help}",
    )


@click.command(cls=UpCommand)
@settings_options("metrics_port")
@click.option(
    "--nats-port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Port of the embedded nats-server [default: {DEFAULT_NATS_PORT}, or a free one].",
)
@with_env_option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data"),
    show_default=True,
    help="Where the embedded nats-server and local providers keep their data.",
)
@click.option(
    "--api-port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_API_PORT,
    show_default=True,
    help="Port of the discovery API.",
)
@with_env_option(
    "--providers-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Named provider instances (YAML); without it, one `local` provider.",
)
@attach(metrics_port_option())
@with_env_option("--event-loop", **EVENT_LOOP_ATTRS)
@click.pass_obj
def up(state: CliState, /, **values: Any) -> None:
    """Run the whole system in one process, with an embedded nats-server.

    The nats-server is started only when neither --nats-url nor NATS_URL names one. It gets one
    user per service (passwords in DATA_DIR/nats/credentials.json, kept across restarts), a
    read-only `reader` and an `admin` (nats CLI contexts: DATA_DIR/nats/nats-reader-context.json
    for reads, nats-context.json for repairs) and is restarted if it dies. Streams are created
    if missing. The proxies accept only current leases' credentials, minted with the lease
    secret in EGRESS_LEASE_SECRET or EGRESS_LEASE_SECRET_FILE, else DATA_DIR/lease-secret (made
    once). Ctrl-C (or SIGTERM) stops everything cleanly. One embedded server per data dir: a
    second `up` on it is refused (exit 2), and the server stops with `up` however `up` ends.
    """
    if values["nats_url"] and values["nats_port"] is not None:
        raise click.UsageError(
            "--nats-port only applies to the embedded nats-server, which is not started when "
            "--nats-url / NATS_URL is set; drop one of them"
        )
    with contextlib.ExitStack() as held:
        if not values["nats_url"]:
            _own_data_dir(held, values["data_dir"].resolve())
        _up_owning(state, values)


def _own_data_dir(held: contextlib.ExitStack, data_dir: Path) -> None:
    """The data dir's lock, held until `up` returns, taken before anything is started or
    written: a second `up` on it is refused with nothing changed
    (docs/decisions/0094-one-data-dir-one-up-one-nats.md), and so is a data dir whose store a
    process `up` did not start uses, a nats-server started by hand whatever its command line
    (docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md)."""
    try:
        held.enter_context(exclusive(data_dir))
    except DataDirBusy as exc:
        raise click.BadParameter(
            f"{exc}; stop that one first, or choose another data dir", param_hint="'--data-dir'"
        ) from None
    except OSError as exc:
        raise click.BadParameter(
            f"cannot lock {data_dir}: {exc.strerror or exc}; choose a data dir you can write",
            param_hint="'--data-dir'",
        ) from None
    try:
        refuse_foreign(EmbeddedNatsServer(data_dir=data_dir / "nats"))
    except StoreInUse as exc:
        raise click.BadParameter(str(exc), param_hint="'--data-dir'") from None


def _up_owning(state: CliState, values: dict[str, Any]) -> None:
    if values["nats_port"] is not None and not _port_free("127.0.0.1", values["nats_port"]):
        raise click.BadParameter(
            f"{values['nats_port']} is in use on 127.0.0.1; choose a free port, or leave the "
            f"flag out (then {DEFAULT_NATS_PORT}, or any free port)",
            param_hint="'--nats-port'",
        )
    # Settings and services are built before anything starts: a bad flag must not leave a
    # nats-server behind, nor show a banner for a system that then falls over.
    settings = settings_for(state, nats_url=values["nats_url"], metrics_port=values["metrics_port"])
    entries = (
        load_providers_config(
            values["providers_config"], default_data_dir=values["data_dir"].resolve()
        )
        if EXECUTOR in SERVICES
        else []
    )
    locals_ = uplocal.local_providers(entries)
    outliving = uplocal.local_providers(entries, types=uplocal.OUTLIVING_TYPES)
    target: socket.socket | None = None
    ctx = click.get_current_context()
    unnamed = ctx.get_parameter_source("check_url") is ParameterSource.DEFAULT
    no_echo = ctx.get_parameter_source("egress_echo_url") is ParameterSource.DEFAULT
    if locals_ and (unnamed or no_echo):
        # No check URL named: local proxies are probed against a target `up` serves itself,
        # so the demo is healthy offline (uplocal.py); a name the operator gave still wins.
        # The same server answers their egress checks with the address it sees.
        target = uplocal.probe_socket()
        if unnamed:
            _per_local(values, "provider_check_url", locals_, uplocal.probe_url(target))
        if no_echo:
            _per_local(values, "provider_egress_echo_url", locals_, uplocal.echo_url(target))
    values["local_providers"] = locals_
    _use_lease_secret(ctx, values["data_dir"].resolve())
    values["probe_target"] = target
    services = [
        build(entry, settings, values)
        for entry in SERVICES.values()
        if not entry.up_optional or values[f"with_{entry.name}"]
    ]
    # The lease commands find the API from the data dir, as the NATS credentials are found.
    announced = (
        apiaddress.announce(values["data_dir"].resolve(), _api_url(values))
        if DISCOVERY in SERVICES
        else None
    )
    try:
        run_until_signalled(_up(settings, services, values), event_loop=values["event_loop"])
    finally:
        if target is not None:
            target.close()
        if announced is not None:
            apiaddress.withdraw(announced)
    log.info("stopped")
    if outliving:
        note = uplocal.still_running_note(uplocal.running_instances(outliving))
        stdout_console().print(Text(f"egress-proxies up stopped: {note}"))


def _per_local(
    values: dict[str, Any], option: str, locals_: list[uplocal.LocalProvider], url: str
) -> None:
    """``NAME=url`` for each local provider the operator's own ``option`` does not name."""
    given = {pair.partition("=")[0] for pair in values.get(option, ())}
    values[option] = (
        *values.get(option, ()),
        *(f"{p.name}={url}" for p in locals_ if p.name not in given),
    )


async def _up(settings: Settings, services: list[Service], values: dict[str, Any]) -> None:
    data_dir: Path = values["data_dir"].resolve()
    server: EmbeddedNatsServer | None = None

    def banner(started: Started) -> None:
        _print_banner(started, server, data_dir, values)

    target: socket.socket | None = values["probe_target"]
    if values["nats_url"]:
        await probe(settings.nats_url)
        async with asyncio.TaskGroup() as group:
            if target is not None:
                group.create_task(uplocal.serve_probe_target(target), name="probe-target")
            group.create_task(run_services(services, settings, on_started=banner), name="services")
        return
    port = values["nats_port"] or _default_nats_port("127.0.0.1")
    server = EmbeddedNatsServer(data_dir=data_dir / "nats", port=port)
    # One left on this store by an `up` that died must not serve it alongside ours (D94).
    await stop_leftovers(server)
    await server.start()
    try:
        # Each service logs in as its own user, so it may write only its own subjects; the
        # supervisor brings the server back if it dies, or ends `up` if it cannot.
        users = {s.name: server.credentials_for(s.name) for s in services}
        embedded = msgspec.structs.replace(
            settings, nats_url=server.url, nats_user="", nats_password=""
        )
        async with asyncio.TaskGroup() as group:
            if target is not None:
                group.create_task(uplocal.serve_probe_target(target), name="probe-target")
            group.create_task(server.supervise(), name="nats-server")
            group.create_task(
                run_services(services, embedded, on_started=banner, credentials=users),
                name="services",
            )
    finally:
        await server.stop()


def _use_lease_secret(ctx: click.Context, data_dir: Path) -> None:
    """Every service of `up` shares one lease secret (D84): the operator's, or one kept in the
    data dir, made on the first `up`, so the proxies it started keep accepting its leases. The
    services read it from the environment, where it stays until `up` returns."""
    if not any(name in SERVICES for name in LEASE_SERVICES):
        return
    if os.environ.get(SECRET_ENV, "").strip() or os.environ.get(SECRET_FILE_ENV, "").strip():
        return
    os.environ[SECRET_FILE_ENV] = str(ensure_secret_file(data_dir))
    ctx.call_on_close(lambda: os.environ.pop(SECRET_FILE_ENV, None))


def _api_url(values: dict[str, Any]) -> str:
    return apiaddress.api_url_for(str(values.get("host") or "127.0.0.1"), values["api_port"])


def _gateway_url(values: dict[str, Any]) -> str:
    """Where crawlers point their HTTP client's proxy (docs/gateway.md)."""
    return apiaddress.api_url_for(str(values["gateway_host"]), values["gateway_port"])


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _default_nats_port(host: str) -> int:
    """4222 when it is free, so a `nats` CLI with no flags finds the demo; any free port if not."""
    return DEFAULT_NATS_PORT if _port_free(host, DEFAULT_NATS_PORT) else free_port(host)


def _print_banner(
    started: Started,
    server: EmbeddedNatsServer | None,
    data_dir: Path,
    values: dict[str, Any],
) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    nats_note = "embedded" if server is not None else "external"
    grid.add_row("NATS", Text(f"{started.nats_url}  ({nats_note})"))
    if server is not None:
        # The passwords stay in the files (0600); the `nats` CLI reads them from there. Reads go
        # through the reader, which can change nothing; the admin's context is for repairs.
        grid.add_row("nats CLI", Text(f"nats --context {server.reader_context_file} stream ls"))
        grid.add_row("repairs", inert(f"nats --context {server.context_file} (admin)"))
    grid.add_row("data dir", Text(str(data_dir)))
    grid.add_row("metrics", Text(started.metrics_url or "off"))
    api = _api_url(values) if DISCOVERY in SERVICES else "not installed"
    grid.add_row("discovery", Text(api))
    grid.add_row("gateway", Text(_gateway_url(values) if GATEWAY in SERVICES else "not installed"))
    providers = values["providers_config"]
    grid.add_row("providers", inert(str(providers) if providers else "built-in defaults (local)"))
    target: socket.socket | None = values["probe_target"]
    for local in values["local_providers"]:
        grid.add_row(
            f"local {local.name}", inert(f"backend {local.backend}, data {local.data_dir}")
        )
    check = values.get("check_url") or "-"
    served = uplocal.probe_url(target) if target is not None else ""
    if served and any(p.endswith(f"={served}") for p in values.get("provider_check_url", ())):
        check = f"{served} for local proxies (served by up), {check} for others"
    grid.add_row("health check", inert(check))
    echo = values.get("egress_echo_url") or "-"
    if not values.get("egress_interval"):
        echo = "off (--egress-interval 0)"
    elif target is not None and any(
        p.endswith(f"={uplocal.echo_url(target)}")
        for p in values.get("provider_egress_echo_url", ())
    ):
        echo = f"{uplocal.echo_url(target)} for local proxies (served by up), {echo} for others"
    grid.add_row("egress check", inert(echo))
    running = ", ".join(started.services) or "none installed yet"
    grid.add_row("services", Text(running))
    grid.add_row("", Text("Ctrl-C to stop", style="dim"))
    console = stdout_console()
    console.print(
        Panel(grid, title=f"egress-proxies {VERSION} up", title_align="left", expand=False)
    )
    console.file.flush()


# ----------------------------------------------------------------------------------------- run


class RunGroup(click.Group):
    """One sub-command per registered service, built when the command line is parsed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SERVICES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = SERVICES.get(cmd_name)
        return None if entry is None else _service_command(entry)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in SERVICES:
            raise click.UsageError(f"unknown service {name!r}; known: {known_names()}", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=RunGroup)
def run() -> None:
    """Run one service (for deployments that scale each service on its own)."""


def _service_command(entry: ServiceEntry) -> click.Command:
    @click.pass_obj
    def callback(state: CliState, /, **values: Any) -> None:
        settings = settings_for(
            state,
            nats_url=values["nats_url"],
            metrics_port=values["metrics_port"],
            service_name=f"egress-proxies-{entry.name}",
        )
        service = build(entry, settings, values)
        run_until_signalled(_run_one(service, settings), event_loop=values["event_loop"])
        log.info("stopped", service=service.name)

    params: list[click.Parameter] = [
        *setting_params(metrics_port_option()),
        env_option("--event-loop", **EVENT_LOOP_ATTRS),
        *entry.options,
    ]
    return click.Command(entry.name, params=params, callback=callback, help=entry.help)


async def _run_one(service: Service, settings: Settings) -> None:
    await probe(settings.nats_url)

    def started(info: Started) -> None:
        log.info(
            "service running",
            service=service.name,
            nats=info.nats_url,
            metrics=info.metrics_url or "off",
        )

    await run_services([service], settings, on_started=started)
