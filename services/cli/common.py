"""What every command shares: ``--nats-url``, connecting, consoles, stopping on signals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import nats.errors
import structlog
from rich.console import Console, RenderableType
from rich.segment import Segment, Segments
from rich.text import Text

from services.cli.envoptions import env_values
from services.cli.flags import option
from services.cli.pure.render import clean
from services.runtime.nats.client import Client as NATS
from services.runtime.nats.connection import (
    ConnectError,
    Connection,
    connect,
    connect_failure,
    credentials_for,
    discard,
)
from services.runtime.settings.shared import Settings, credentials_from_env, split_urls
from services.runtime.settings.spec import field_named, setting_fields

log = structlog.get_logger("egress.cli")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

PROBE_TIMEOUT = 5.0
PIPE_WIDTH = 200

EXIT_NOT_DONE = 10
"""``apply --wait`` / ``delete --wait``: a proxy ended Failed, or was not Ready and healthy (not
removed) within ``--timeout``."""
# 11, lease rotate --wait unfinished, is with the other lease codes in ``api_client``.
EXIT_SWEEP_INCOMPLETE = 12
"""``gc run-once``: a provider (or its leftovers) was skipped, a delete failed, or another sweep
held the lock."""


class Unfinished(click.ClickException):
    """A command that ran correctly but could not do all it was asked: each kind has its own
    exit code, so a script tells it from a bug (1) and from bad usage (2); shown like every other
    CLI error."""

    def show(self, file: Any = None) -> None:
        Console(stderr=True, soft_wrap=True, highlight=False).print(
            Text(f"error: {clean(self.message, multiline=True)}", style="red")
        )


class NotDone(Unfinished):
    exit_code = EXIT_NOT_DONE


class SweepIncomplete(Unfinished):
    exit_code = EXIT_SWEEP_INCOMPLETE


@dataclass(frozen=True, slots=True)
class CliState:
    """The group's global options, handed to every command through the click context."""

    log_level: str = "info"
    log_format: str = "console"


def settings_for(state: CliState, **overrides: object) -> Settings:
    """From what click parsed: the group's log options, the command's flags (``overrides``,
    None when not given) and the settings it reads from the environment only."""
    parsed = env_values(click.get_current_context())
    parsed |= {k: v for k, v in overrides.items() if v is not None}
    return Settings.from_options(log_level=state.log_level, log_format=state.log_format, **parsed)


def env_settings(*flagged: str) -> dict[str, click.Option]:
    """The settings a command reads from their variables only, as ``EnvSetting`` parameters:
    those it has no option for, ``flagged`` being those it has (by parameter name). Every
    command that builds ``Settings`` so reads and checks the same variables."""
    return {
        f.name: option(f, env_only=True)
        for f in setting_fields(Settings)
        if f.name not in flagged and f.name not in GROUP_SETTINGS
    }


GROUP_SETTINGS = ("log_level", "log_format")
"""Settings the ``egress-proxies`` group has flags for, so no command reads them again."""


def nats_url_option() -> click.Option:
    """``--nats-url``, left None when neither the flag nor ``NATS_URL`` is set: ``up`` starts its
    own nats-server exactly then, and every other command falls back to the default."""
    return option(field_named(Settings, "nats_url"), default=None)


def setting_params(*flags: click.Option) -> list[click.Option]:
    """The settings of a command built from a list of parameters (``run NAME``): ``--nats-url``,
    its other setting ``flags``, and the rest from their variables."""
    shown = ("nats_url", *(f.name for f in flags if f.name))
    return [nats_url_option(), *flags, *env_settings(*shown).values()]


def attach(param: click.Parameter) -> Callable[[F], F]:
    """A decorator that adds a parameter already made (a generated option), as ``click.option``
    adds the one it makes: parameters attached to a function are taken last first."""

    def add(f: F) -> F:
        if isinstance(f, click.Command):
            f.params.append(param)
        else:
            f.__dict__.setdefault("__click_params__", []).append(param)
        return f

    return add


def settings_options(*flagged: str) -> Callable[[F], F]:
    """``setting_params`` for a command declared with ``@click.command``: ``--nats-url`` and the
    settings it has no flag for; ``flagged`` names the settings it declares flags for itself."""
    shown = ("nats_url", *flagged)

    def decorate(f: F) -> F:
        for param in env_settings(*shown).values():
            f = attach(param)(f)
        return attach(nats_url_option())(f)

    return decorate


async def connect_once(url: str, timeout: float = PROBE_TIMEOUT) -> NATS:
    """A connection that fails fast when nothing answers at ``url``.

    The runtime's connection reconnects forever, which is right for a service riding out a
    nats-server restart; with nats-py it also means a first connection that never succeeds never
    returns. A command must say "unreachable" instead of hanging, so it makes a bounded attempt
    (nats-py reads ``max_reconnect_attempts`` <= 0 as "forever", hence 1: two tries).
    """
    seen: list[Exception] = []
    login = credentials_for(url, credentials_from_env())

    async def remember(exc: Exception) -> None:
        """Keep the cause for the message instead of letting nats-py log each try."""
        seen.append(exc)

    # nats-py types its timeouts as int; they are floats at heart, hence the untyped options.
    options: dict[str, Any] = {"reconnect_time_wait": 0.1, "connect_timeout": timeout}
    nc = NATS()
    try:
        await nc.connect(
            servers=split_urls(url),
            max_reconnect_attempts=1,
            error_cb=remember,
            name="egress-proxies-cli",
            user=login.user if login else None,
            password=login.password if login else None,
            **options,
        )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        await discard(nc)
        raise ConnectError(connect_failure(url, login, exc, seen)) from exc
    return nc


async def probe(url: str) -> None:
    """Check the server answers before handing ``url`` to code that would wait for it forever."""
    nc = await connect_once(url)
    await nc.close()


async def open_connection(url: str, *, lasting: bool = False) -> Connection:
    """A one-shot command gets a connection that fails rather than waits; a ``lasting`` one
    (``events --follow``) the runtime's, which rides out a nats-server restart."""
    if lasting:
        await probe(url)
        return await connect(url, name="egress-proxies-cli", credentials=credentials_from_env())
    nc = await connect_once(url)
    return Connection(nc=nc, js=nc.jetstream())


def stdout_console() -> Console:
    """A console on the current standard output (looked up now, so a captured one is honoured).

    Piped output gets a wide fixed width: 80 columns would wrap every table row, and a reader
    piping into ``grep`` or ``less -S`` wants one line per row.
    """
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(
        file=sys.stdout, width=PIPE_WIDTH if piped else None, highlight=False, soft_wrap=False
    )


def print_trimmed(renderable: RenderableType) -> None:
    """``renderable`` on standard output without the spaces rich pads each line with to the
    table's width: a free-text column (``describe``'s NOTE) would otherwise pad every line of the
    output to the pipe's width, which a reader copying or diffing it does not want."""
    console = stdout_console()
    lines = console.render_lines(renderable, console.options, pad=False)
    out: list[Segment] = []
    for line in lines:
        while line and not line[-1].control and not line[-1].text.strip():
            line.pop()
        if line and not line[-1].control:
            line[-1] = Segment(line[-1].text.rstrip(), line[-1].style)
        out.extend(line)
        out.append(Segment.line())
    console.print(Segments(out), end="")


async def until_signalled(work: Coroutine[Any, Any, T]) -> T | None:
    """Run ``work`` until it ends, or until SIGINT/SIGTERM cancels it (then return None).

    Cancelling lets every ``finally`` run (services stop, the connection closes, the embedded
    nats-server is stopped), so Ctrl-C is a clean stop with exit 0 rather than a traceback.
    Handlers can only be installed in the main thread; elsewhere (tests driving the CLI from a
    worker thread) the work simply runs to its end.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        # A second Ctrl-C gets Python's default again: a way out if stopping itself hangs.
        for each in installed:
            loop.remove_signal_handler(each)
        log.info("stopping", signal=sig.name, hint="press Ctrl-C again to force")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (ValueError, RuntimeError, NotImplementedError):
            continue
        installed.append(sig)
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        for sig in installed:
            loop.remove_signal_handler(sig)


EVENT_LOOPS = ("uvloop", "asyncio")
EVENT_LOOP_ATTRS: dict[str, Any] = {
    "type": click.Choice(EVENT_LOOPS),
    "default": "uvloop",
    "show_default": True,
    "help": "The services' event loop: uvloop (a fifth less CPU per lease in the discovery "
    "benchmark, docs/benchmarks.md) or the standard asyncio one.",
}
"""``--event-loop`` of ``up`` and ``run``: the long-running commands, where the loop's cost per
request counts (docs/decisions/0089-discovery-s-views-follow-by.md). One-shot commands use the
standard loop."""


def run_until_signalled(work: Coroutine[Any, Any, T], *, event_loop: str = "asyncio") -> T | None:
    """Run ``work`` until it ends or SIGINT/SIGTERM; on uvloop when asked (and importable:
    where uvloop has no wheel the standard loop serves, and says so)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop":
        try:
            import uvloop  # noqa: PLC0415 (an optional speed-up, imported only when asked for)
        except ImportError:
            log.warning("uvloop is not installed: running on the standard asyncio loop")
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(until_signalled(work))


table_or_json_lines = click.option(
    "--output",
    "-o",
    type=click.Choice(("table", "json")),
    default="table",
    show_default=True,
    help="A table for people, or one JSON object per line for tools.",
)
"""``-o`` of the commands that list stored events (``events``, ``streams check``)."""
