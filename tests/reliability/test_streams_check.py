"""`streams check` and `events` on a log that holds events no reader can use."""

from __future__ import annotations

import json

import pytest

from events import subjects
from events.schemas import ProxyDeclared, ProxySpec
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.system import base_env, cli

pytestmark = pytest.mark.reliability


async def poisoned_log(conn: Connection, store: JetStreamEventStore) -> dict[str, int]:
    declared = ProxyDeclared(uid="p1", namespace="ns", name="p1", spec=ProxySpec(provider="local"))
    await store.append(subjects.proxy("p1"), [NewEvent(declared, "p1-declared")], expected_seq=0)
    js = conn.js
    return {
        "not-json": (
            await js.publish(
                "proxy.p1.status", b"{not json", headers={"Egress-Event-Type": "PhaseChanged"}
            )
        ).seq,
        "future": (
            await js.publish(
                "proxy.p1.health", b'{"type":"Later"}', headers={"Egress-Event-Type": "Later"}
            )
        ).seq,
        "null-ttl": (
            await js.publish(
                "lease.p1",
                b'{"type":"LeaseAcquired","lease_id":"x","proxy_uid":"p1","ttl_seconds":null}',
            )
        ).seq,
    }


async def test_streams_check_lists_every_event_no_fold_can_use(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    seqs = await poisoned_log(conn, jetstream_store)
    env = base_env()
    got = cli("streams", "check", "-o", "json", "--nats-url", nats_server.url, env=env)
    assert got.returncode == 9, got.stdout + got.stderr
    found = {(r["stream"], r["seq"]): r for r in map(json.loads, got.stdout.splitlines())}
    assert set(found) == {
        ("PROXY", seqs["not-json"]),
        ("PROXY", seqs["future"]),
        ("LEASE", seqs["null-ttl"]),
    }
    assert found[("PROXY", seqs["not-json"])]["reason"] == "undecodable"
    assert found[("PROXY", seqs["future"])]["reason"] == "unknown_type"
    assert found[("LEASE", seqs["null-ttl"])]["reason"] == "undecodable"

    table = cli("streams", "check", "--nats-url", nats_server.url, env=env)
    assert table.returncode == 9
    assert "PROXY: 3 events read, 2 no fold can use" in table.stdout
    assert "LEASE: 1 events read, 1 no fold can use" in table.stdout
    assert "Traceback" not in table.stderr


async def test_streams_check_passes_a_clean_log(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    declared = ProxyDeclared(uid="p1", namespace="ns", name="p1", spec=ProxySpec(provider="local"))
    await jetstream_store.append(subjects.proxy("p1"), [NewEvent(declared, "d")], expected_seq=0)
    got = cli("streams", "check", "--nats-url", nats_server.url, env=base_env())
    assert got.returncode == 0, got.stdout + got.stderr
    assert "PROXY: 1 events read, 0 no fold can use" in got.stdout


async def test_events_marks_what_every_service_skips(
    nats_server: EmbeddedNatsServer, conn: Connection, jetstream_store: JetStreamEventStore
) -> None:
    seqs = await poisoned_log(conn, jetstream_store)
    env = base_env()
    got = cli("events", "--proxy", "p1", "-o", "json", "--nats-url", nats_server.url, env=env)
    assert got.returncode == 0, got.stderr
    lines = [json.loads(line) for line in got.stdout.splitlines()]
    skipped = {line["seq"]: line["skipped"] for line in lines if "skipped" in line}
    assert skipped == {seqs["not-json"]: "undecodable", seqs["future"]: "unknown_type"}
    # A width of its own: under an xdist worker the table would drop the column that says it.
    wide = env | {"COLUMNS": "240"}
    table = cli("events", "--proxy", "p1", "--nats-url", nats_server.url, env=wide)
    assert table.stdout.count("SKIPPED (") == 2
