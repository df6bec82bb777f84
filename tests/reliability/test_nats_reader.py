"""The operator's read-only NATS user, ``reader``, against a real nats-server and the real ``nats``
CLI: every read docs/nats-cli.md shows works with the context file ``up`` writes for it, and every
command that would change the log, a stream, a service's durable consumer or a KV bucket is refused
by the server, which leaves them as they were."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, KeyValueConfig
from nats.js.errors import KeyNotFoundError

from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.nats.users import CONSUMERS, READER, permissions
from tests.support.natscli import NatsCli
from tests.support.natsclient import client
from tests.support.waiting import until

pytestmark = pytest.mark.reliability

DURABLES = sorted(CONSUMERS)
STREAM_NAMES = tuple(spec.name for spec in STREAMS)
VIEW_START = "Subject: proxy.p1.declared Received: "


def violation(subject: str) -> str:
    return f'Permissions Violation for Publish to "{subject}"'


async def state(conn: Connection) -> dict[str, Any]:
    """What a reader must not change: every stream's configuration and messages, and each
    service durable's configuration and position."""
    found: dict[str, Any] = {}
    for name in STREAM_NAMES:
        info = await conn.js.stream_info(name)
        found[name] = (info.config.as_dict(), info.state.messages, info.state.last_seq)
    for durable in DURABLES:
        info = await conn.js.consumer_info(CONSUMERS[durable], durable)
        found[durable] = (info.config.as_dict(), info.delivered, info.ack_floor, info.num_pending)
    return found


@pytest.fixture
async def log(nats_server: EmbeddedNatsServer, conn: Connection) -> Connection:
    """Streams with a few events, a dead letter, the services' durables and a KV bucket."""
    for i in range(3):
        await conn.js.publish("proxy.p1.declared", json.dumps({"i": i}).encode())
    await conn.js.publish("lease.p1", b"{}")
    await conn.js.publish("deadletter.reconciler", b"{}")
    for durable in DURABLES:
        config = ConsumerConfig(
            durable_name=durable, ack_policy=AckPolicy.EXPLICIT, filter_subjects=["proxy.*.*"]
        )
        await conn.js.add_consumer(CONSUMERS[durable], config)
    await conn.js.create_key_value(KeyValueConfig(bucket="egress-gc-lock"))
    return conn


def test_the_reader_writes_nothing_and_spares_the_durables() -> None:
    granted = permissions(READER)
    assert granted is not None
    allow, deny = granted["publish"]["allow"], granted["publish"]["deny"]
    assert all(s.startswith(("$JS.API.", "$JS.ACK.")) for s in allow), allow
    for durable in DURABLES:
        for pattern in ("CREATE.*.{}", "CREATE.*.{}.>", "MSG.NEXT.*.{}", "DELETE.*.{}"):
            assert f"$JS.API.CONSUMER.{pattern.format(durable)}" in deny
        assert f"$JS.ACK.*.{durable}.>" in deny
    assert granted["subscribe"] == {"allow": ["_INBOX.>"]}


async def test_the_reader_reads_everything_with_the_nats_cli(
    nats_server: EmbeddedNatsServer, log: Connection, tmp_path: Path
) -> None:
    context = nats_server.reader_context_file
    assert context.stat().st_mode & 0o777 == 0o600
    assert json.loads(context.read_text())["user"] == READER
    nats = NatsCli(context, tmp_path / "home")
    before = await state(log)

    assert set(await nats.json("stream", "ls")) == set(STREAM_NAMES)
    assert "Information for Stream PROXY" in await nats.ok("stream", "info", "PROXY")
    assert (await nats.json("stream", "info", "PROXY"))["state"]["messages"] == 3
    got = await nats.json("stream", "get", "PROXY", "2")
    assert (got["seq"], got["subject"]) == (2, "proxy.p1.declared")
    assert "proxy.p1.declared" in await nats.ok("stream", "get", "PROXY", "2")
    viewed = await nats.view("PROXY", "proxy.p1.>")
    assert viewed.count(VIEW_START) == 3, viewed
    dump = await nats.ok("sub", "--stream", "PROXY", "--all", "-T", "proxy.p1.>", "--dump=-")
    records = [json.loads(r) for r in dump.split("\0") if r.strip()]
    assert [r["Subject"] for r in records] == ["proxy.p1.declared"] * 3
    dead = await nats.json("stream", "info", "DEADLETTER")
    assert dead["state"]["messages"] == 1
    assert set(DURABLES) <= set(await nats.json("consumer", "ls", "PROXY"))
    for durable in DURABLES:
        info = await nats.json("consumer", "info", "PROXY", durable)
        assert info["num_pending"] == 3, info
    assert "egress-gc-lock" in await nats.ok("kv", "ls")

    # `view` deleted its pager consumer; `sub`'s ephemeral one expires after 5 s idle. The
    # durables are where they were.
    async def only_durables_left() -> bool:
        return sorted(await nats.json("consumer", "ls", "PROXY")) == DURABLES

    await until(only_durables_left, timeout=30, what="the CLI's ephemeral consumers to go")
    assert await state(log) == before


REFUSED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("stream", "edit", "PROXY", "--max-age=1h", "-f"), "$JS.API.STREAM.UPDATE.PROXY"),
    (("stream", "seal", "LEASE", "-f"), "$JS.API.STREAM.UPDATE.LEASE"),
    (("stream", "rm", "PROXY", "-f"), "$JS.API.STREAM.DELETE.PROXY"),
    (("stream", "purge", "PROXY", "-f"), "$JS.API.STREAM.PURGE.PROXY"),
    (("stream", "purge", "DEADLETTER", "-f"), "$JS.API.STREAM.PURGE.DEADLETTER"),
    (("stream", "rmm", "PROXY", "1", "-f"), "$JS.API.STREAM.MSG.DELETE.PROXY"),
    (("stream", "rmm", "DEADLETTER", "1", "-f"), "$JS.API.STREAM.MSG.DELETE.DEADLETTER"),
    (("stream", "add", "OTHER", "--subjects=other.x", "--defaults"), "$JS.API.STREAM.CREATE.OTHER"),
    (("pub", "proxy.x.declared", "{}"), "proxy.x.declared"),
    (("pub", "lease.x", "{}"), "lease.x"),
    (("kv", "put", "egress-gc-lock", "k", "v"), "$KV.egress-gc-lock.k"),
    *(
        (("consumer", "rm", "PROXY", durable, "-f"), f"$JS.API.CONSUMER.DELETE.PROXY.{durable}")
        for durable in DURABLES
    ),
    *(
        (
            ("consumer", "edit", "PROXY", durable, "--max-pending=5", "-f"),
            f"$JS.API.CONSUMER.CREATE.PROXY.{durable}",
        )
        for durable in DURABLES
    ),
    *(
        (("consumer", "next", "PROXY", durable), f"$JS.API.CONSUMER.MSG.NEXT.PROXY.{durable}")
        for durable in DURABLES
    ),
)


async def test_the_reader_is_refused_every_change_with_the_nats_cli(
    nats_server: EmbeddedNatsServer, log: Connection, tmp_path: Path
) -> None:
    # A refused request gets no reply: the CLI waits --timeout, then fails.
    nats = NatsCli(nats_server.reader_context_file, tmp_path / "home", timeout="2s")
    before = await state(log)
    # Each refusal costs the CLI its whole timeout, so the commands run side by side.
    answers = await nats.run_all([args for args, _ in REFUSED])
    for (args, subject), done in zip(REFUSED, answers, strict=True):
        # natscli v0.5.0's `stream seal` prints the stream and exits 0 when its update got no
        # reply; the server's refusal, and the unchanged stream below, are what count.
        assert done.returncode != 0 or args[:2] == ("stream", "seal"), (args, done.stdout)
        assert violation(subject) in done.stderr, (args, done.stderr)
    assert await state(log) == before
    with pytest.raises(KeyNotFoundError):
        await (await log.js.key_value("egress-gc-lock")).get("k")


async def test_the_reader_cannot_reach_a_durable_by_other_api_calls(
    nats_server: EmbeddedNatsServer, log: Connection
) -> None:
    """What the CLI does not offer but a client could send: acks for a durable, the legacy
    ephemeral and durable create calls (whose consumer name is in the body, out of reach of a
    subject rule), and the KV and dead-letter subjects."""
    before = await state(log)
    probes = [
        *(f"$JS.ACK.PROXY.{durable}.1.1.1.1.0" for durable in DURABLES),
        *(f"$JS.API.CONSUMER.CREATE.PROXY.{durable}.proxy.>" for durable in DURABLES),
        *(f"$JS.API.CONSUMER.DURABLE.CREATE.PROXY.{durable}" for durable in DURABLES),
        "$JS.API.CONSUMER.CREATE.PROXY",
        "$JS.API.CONSUMER.PAUSE.PROXY.reconciler",
        "$JS.API.STREAM.PURGE.DEADLETTER",
        "$JS.API.ACCOUNT.PURGE.ALL",
        "$KV.egress-gc-lock.k",
        "deadletter.reconciler",
        "gc.local",
    ]
    async with client(nats_server.url_for(READER)) as reader:
        for subject in probes:
            await reader.nc.publish(subject, b"{}")
        await reader.nc.flush()

        async def all_refused() -> bool:
            return all(reader.refused(s) for s in probes)

        await until(all_refused, timeout=10, what="the server to refuse every probe")
    assert await state(log) == before
