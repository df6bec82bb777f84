"""The ``egress-proxies`` command: global options, sub-commands, and what a failure exits with.

Failures we understand end with one red line on standard error and an exit code a script can act
on; a traceback is kept for what we did not foresee (a bug), where it is the useful answer. Error
text quotes paths, names and answers from elsewhere, so it is shown inert like every table
(``render.clean``): it keeps our line breaks, and nothing in it can act on the terminal.
"""

from __future__ import annotations

import errno
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.text import Text

from events.errors import EventStoreError
from services.cli.admin.clients_cmd import clients
from services.cli.admin.crd_cmd import crd
from services.cli.admin.gc_cmd import gc
from services.cli.admin.providers_cmd import providers
from services.cli.backup.backup_cmd import backup
from services.cli.backup.restore_cmd import restore
from services.cli.common import CliState, attach
from services.cli.flags import option
from services.cli.fleet.get_cmd import get_cmd
from services.cli.fleet.pools_cmd import describe_cmd, scale_cmd
from services.cli.fleet.proxies_cmd import apply_cmd, delete_cmd
from services.cli.lease.holder_cmd import renew  # noqa: F401  # registers renew and list on `lease`
from services.cli.lease.lease_cmd import lease
from services.cli.log.check_cmd import check
from services.cli.log.events_cmd import events
from services.cli.log.streams_cmd import streams
from services.cli.log.traffic_cmd import traffic_cmd
from services.cli.pure.render import clean
from services.cli.run.local_cmd import local
from services.cli.run.up_cmd import run, up
from services.cli.tracing import command_span
from services.runtime.nats.connection import ConnectError
from services.runtime.nats.server import NatsServerError
from services.runtime.observability.logs import configure_logging, scrub
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import LOG_FORMATS, LOG_LEVELS, Settings
from services.runtime.settings.spec import field_named
from services.runtime.version import VERSION

ARGS = "egress.args"
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_EVENT_LOG = 4
EXIT_NATS_SERVER = 5

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, EXIT_USAGE),
    (ConnectError, EXIT_UNREACHABLE),
    (EventStoreError, EXIT_EVENT_LOG),
    (NatsServerError, EXIT_NATS_SERVER),
)

EPILOG = """\b
Exit codes:
  0  done (or stopped with Ctrl-C / SIGTERM)
  1  unexpected error (a bug: the traceback is printed)
  2  bad usage or configuration (flag, environment variable, port in use)
  3  nats-server unreachable (lease: the discovery API unreachable)
  4  event log problem (a stream configured differently, missing, or not answering)
  5  the embedded nats-server could not start
  6  lease acquire: no proxy available now (it says when to try again)
  7  lease release / report / renew: unknown lease (never issued, released or expired)
  8  lease acquire: no proxy matches the selector at all (it lists the attribute keys)
  9  streams check: the log holds events no fold can use
 10  apply --wait: a proxy ended Failed, or was not Ready and healthy within --timeout, or
     a pool had not all its members so (delete --wait: not removed within it); the error
     names each proxy and pool and why
 11  lease rotate --wait: the rotation failed, was cancelled, or had not ended in time
 12  gc run-once: a provider (or its leftovers) was skipped, a delete failed, or another
     sweep held the lock
 13  restore: the backup is incomplete, damaged or altered (it names the file); nothing changed
 14  providers check: a provider entry would fail (it names the entry, the check and the fix)
"""


def classify(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and message for a failure we understand; None for anything else.

    Services run in a task group, so their failures arrive wrapped in exception groups: the
    first one we understand is reported.
    """
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = classify(inner)
            if found is not None:
                return found
        return None
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return EXIT_USAGE, f"{exc.strerror or exc}: choose another port (see --help)"
    return None


def fail(code: int, message: str) -> NoReturn:
    # Standard error is a service's log too: a password in a URL it quotes is scrubbed like one.
    Console(stderr=True, soft_wrap=True, highlight=False).print(
        Text(f"error: {clean(scrub(message), multiline=True)}", style="red")
    )
    raise click.exceptions.Exit(code)


class Cli(click.Group):
    """Turns our errors into exit codes wherever in the command tree they are raised."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGS] = list(args)  # the command line, for the command's span
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        # The failure is turned into its exit code inside the command's span, so the span
        # records the code a script sees (cli/tracing.py).
        with command_span(self, ctx.meta.get(ARGS, [])):
            try:
                return super().invoke(ctx)
            except (click.exceptions.Exit, click.ClickException, click.Abort):
                raise
            except Exception as exc:
                found = classify(exc)
                if found is None:
                    raise
                fail(*found)


@click.group(cls=Cli, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="egress-proxies")
@attach(
    option(field_named(Settings, "log_level"), type=click.Choice(LOG_LEVELS, case_sensitive=False))
)
@attach(
    option(
        field_named(Settings, "log_format"), type=click.Choice(LOG_FORMATS, case_sensitive=False)
    )
)
@click.pass_context
def main(ctx: click.Context, log_level: str, log_format: str) -> None:
    """Egress proxies for web crawlers: declare proxies, the system provisions, probes, replaces
    and garbage-collects them, and leases them out; every fact is an event in NATS JetStream."""
    configure_logging(log_level, log_format)
    ctx.obj = CliState(log_level=log_level.lower(), log_format=log_format.lower())


main.add_command(up)
main.add_command(run)
main.add_command(events)
main.add_command(traffic_cmd)
streams.add_command(check)
main.add_command(streams)
main.add_command(apply_cmd)
main.add_command(delete_cmd)
main.add_command(get_cmd)
main.add_command(describe_cmd)
main.add_command(scale_cmd)
main.add_command(gc)
main.add_command(lease)
main.add_command(local)
main.add_command(crd)
main.add_command(clients)
main.add_command(backup)
main.add_command(restore)
main.add_command(providers)


if __name__ == "__main__":
    main()
