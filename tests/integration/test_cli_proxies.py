"""`apply`, `delete` and `get` against a real nats-server: strict fields, --all, wide output."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from events import subjects
from events.customresource import cli_uid
from events.meter import UpstreamMetered
from events.schemas import HealthChanged, Phase, PhaseChanged
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    yield from restore_logging_after()


def manifest(tmp_path: Path, text: str) -> str:
    path = tmp_path / "proxies.yaml"
    path.write_text(text)
    return str(path)


def proxy(name: str, namespace: str = "crawl", spec: str = "attributes: {country: de}") -> str:
    return (
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        f"metadata: {{name: {name}, namespace: {namespace}}}\n"
        f"spec:\n  provider: local\n  {spec}\n"
    )


async def test_apply_refuses_a_misspelt_field_naming_the_closest(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    path = manifest(tmp_path, proxy("de-1", spec="atributes: {country: de}"))
    got = await cli("apply", "-f", path, "--nats-url", nats_server.url)
    assert got.exit_code == 2, got.output
    assert "spec.atributes: unknown field; did you mean spec.attributes?" in got.output
    assert "--validate=warn" in got.output
    listed = await cli("get", "--nats-url", nats_server.url)
    assert "No proxies." in listed.output


async def test_apply_with_validate_warn_applies_and_warns(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    path = manifest(tmp_path, proxy("de-1", spec="healthChek: {}"))
    got = await cli("apply", "-f", path, "--validate", "warn", "--nats-url", nats_server.url)
    assert got.exit_code == 0, got.output
    assert "warning:" in got.output
    assert "spec.healthChek" in got.output
    assert "proxy crawl/de-1 created" in got.output


async def test_delete_all_deletes_every_proxy_or_one_namespace(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    text = "---\n".join([proxy("a", "one"), proxy("b", "one"), proxy("c", "two")])
    assert (
        await cli("apply", "-f", manifest(tmp_path, text), "--nats-url", nats_server.url)
    ).exit_code == 0
    one = await cli("delete", "--all", "--namespace", "one", "--nats-url", nats_server.url)
    assert one.exit_code == 0, one.output
    assert "proxy one/a" in one.output
    assert "proxy one/b" in one.output
    assert "two/c" not in one.output
    rest = await cli("delete", "--all", "--nats-url", nats_server.url)
    assert rest.exit_code == 0, rest.output
    assert "two/c" in rest.output
    usage = await cli("delete", "crawl/x", "--all", "--nats-url", nats_server.url)
    assert usage.exit_code == 2
    lonely = await cli("delete", "crawl/x", "--namespace", "one", "--nats-url", nats_server.url)
    assert lonely.exit_code == 2


async def test_get_wide_shows_the_uid_and_why_a_proxy_is_unhealthy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    assert (
        await cli("apply", "-f", manifest(tmp_path, proxy("de-1")), "--nats-url", nats_server.url)
    ).exit_code == 0
    uid = cli_uid("crawl", "de-1")
    ready = PhaseChanged(phase=Phase.READY, ip="127.0.0.1", url="http://127.0.0.1:3128")
    sick = HealthChanged(healthy=False, reason="ProbeFailed", message="HTTP 502 from the origin")
    await jetstream_store.append(subjects.proxy(uid), [NewEvent(ready, "r"), NewEvent(sick, "s")])
    wide = await cli("get", "-o", "wide", "--nats-url", nats_server.url)
    assert wide.exit_code == 0, wide.output
    assert "UID" in wide.output
    assert uid in wide.output
    assert "HTTP 502 from the origin" in wide.output
    plain = await cli("get", "--nats-url", nats_server.url)
    assert uid not in plain.output
    assert "unhealthy" in plain.output


async def test_get_wide_shows_an_upstream_proxys_bytes_of_today_and_a_spent_budget(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    """D162: the meter's records of today, per proxy; ``!budget`` once its provider's are
    spent, and ``-`` for a proxy that moved nothing (or whose records are of another day)."""
    text = proxy("de-1") + "---\n" + proxy("de-2")
    assert (
        await cli("apply", "-f", manifest(tmp_path, text), "--nats-url", nats_server.url)
    ).exit_code == 0
    uid = cli_uid("crawl", "de-1")
    record = UpstreamMetered(
        provider="local",
        replica="executor-1",
        start=datetime.now(UTC),
        interval_seconds=10.0,
        proxy_uid=uid,
        lease_id="lease-1",
        bytes_up=2048,
        bytes_down=3 * 1024 * 1024,
    )
    await jetstream_store.append(subjects.meter("local"), [NewEvent(record, "m1")])
    wide = await cli("get", "-o", "wide", "--nats-url", nats_server.url)
    assert wide.exit_code == 0, wide.output
    assert "BYTES" in wide.output
    rows = {line.split()[1]: line for line in wide.output.splitlines() if line.startswith("crawl")}
    assert "↑2.0 KiB ↓3.0 MiB" in rows["de-1"]
    assert "↑" not in rows["de-2"]
    assert "!budget" not in wide.output
    spent = msgspec.structs.replace(record, bytes_up=1, bytes_down=0, budget_bytes_per_day=1024)
    await jetstream_store.append(subjects.meter("local"), [NewEvent(spent, "m2")])
    wide = await cli("get", "-o", "wide", "--nats-url", nats_server.url)
    rows = {line.split()[1]: line for line in wide.output.splitlines() if line.startswith("crawl")}
    assert "↑2.0 KiB ↓3.0 MiB !budget" in rows["de-1"]
    assert "- !budget" in rows["de-2"]
    before = await cli(
        "get", "-o", "wide", "--at", "2020-01-01T00:00:00Z", "--nats-url", nats_server.url
    )
    assert "↑" not in before.output
