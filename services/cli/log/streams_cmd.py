"""``streams init`` and ``streams info``: create the event streams and see what they hold."""

from __future__ import annotations

import click
import nats.errors
from nats.js.errors import NotFoundError
from rich.text import Text

from events.errors import StoreUnavailable
from services.cli.common import (
    CliState,
    open_connection,
    run_until_signalled,
    settings_for,
    settings_options,
    stdout_console,
)
from services.cli.envoptions import with_env_option
from services.cli.pure.render import StreamRow, streams_table
from services.runtime.eventlog.streams import STREAMS, ensure_streams
from services.runtime.nats.connection import Connection


@click.group("streams")
def streams() -> None:
    """Create and inspect the event streams (PROXY, LEASE, GC, DEADLETTER)."""


@streams.command("init")
@settings_options("stream_replicas")
@with_env_option(
    "--replicas",
    "stream_replicas",
    env="STREAM_REPLICAS",
    type=int,
    default=None,
    help="Copies of each stream: 1 (the default) on one server, 3 (or 5) in a cluster.",
)
@click.pass_obj
def init(state: CliState, nats_url: str | None, stream_replicas: int | None) -> None:
    """Create the streams that are missing; never change one that exists.

    A stream that exists with other settings is reported with every difference (exit 4):
    changing retention or limits of an event log silently could lose history.
    """
    settings = settings_for(state, nats_url=nats_url, stream_replicas=stream_replicas)
    created = run_until_signalled(_init(settings.nats_url, settings.stream_replicas))
    if created is None:
        return
    console = stdout_console()
    for spec in STREAMS:
        if spec.name in created:
            console.print(Text(f"{spec.name}: created (replicas {settings.stream_replicas})"))
        else:
            console.print(Text(f"{spec.name}: exists, unchanged"))


async def _init(url: str, replicas: int) -> list[str]:
    conn = await open_connection(url)
    try:
        return await ensure_streams(conn.js, replicas)
    except (nats.errors.Error, TimeoutError) as exc:
        raise StoreUnavailable(f"cannot create the streams: {exc}") from exc
    finally:
        await conn.close()


@streams.command("info")
@settings_options()
@click.pass_obj
def info(state: CliState, nats_url: str | None) -> None:
    """Show each stream's subjects, size, sequence range, replicas and consumers."""
    settings = settings_for(state, nats_url=nats_url)
    rows = run_until_signalled(_info(settings.nats_url))
    if rows is not None:
        stdout_console().print(streams_table(rows))


async def _info(url: str) -> list[StreamRow]:
    conn = await open_connection(url)
    try:
        return [await _row(conn, spec.name) for spec in STREAMS]
    finally:
        await conn.close()


async def _row(conn: Connection, name: str) -> StreamRow:
    try:
        found = await conn.js.stream_info(name)
    except NotFoundError:
        return StreamRow(name, missing=True)
    except (nats.errors.Error, TimeoutError) as exc:
        raise StoreUnavailable(f"cannot read the state of stream {name}: {exc}") from exc
    state, config = found.state, found.config
    return StreamRow(
        stream=name,
        subjects=tuple(config.subjects or ()),
        messages=state.messages,
        bytes=state.bytes,
        first_seq=state.first_seq,
        last_seq=state.last_seq,
        replicas=config.num_replicas or 1,
        consumers=state.consumer_count,
    )
