"""Commands tell the truth (docs/decisions/0098-commands-tell-the-truth-exit.md): ``apply --wait``
fails when a proxy did,
``apply -f a -f b`` applies both, a provider the running system lacks is refused, ``gc run-once``
finds ``up``'s lease secret, and what did not get done has an exit code of its own, not 1 (a bug).
Against a real nats-server, a real discovery service and the real GC."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events import subjects
from events.customresource import cli_uid
from events.schemas import HealthChanged, Phase, PhaseChanged
from events.store import NewEvent
from services.cli.common import EXIT_NOT_DONE, EXIT_SWEEP_INCOMPLETE
from services.cli.lease.api_client import EXIT_ROTATION_NOT_DONE
from services.gc.lock import SweepLock
from services.providers.squidauth.secret import ensure_secret_file
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import Connection
from services.runtime.nats.server import EmbeddedNatsServer
from tests.support.clirun import cli, restore_logging_after
from tests.support.discovery import discovery, ready_proxy

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

NO_SECRET = {"EGRESS_LEASE_SECRET": None, "EGRESS_LEASE_SECRET_FILE": None, "DATA_DIR": None}


def proxy(name: str, provider: str = "local") -> str:
    return (
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        f"metadata: {{name: {name}, namespace: crawl}}\n"
        f"spec:\n  provider: {provider}\n  attributes: {{country: de}}\n"
    )


def manifest(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def declared(url: str) -> list[str]:
    listed = json.loads((await cli("get", "-o", "json", "--nats-url", url)).stdout)
    return sorted(f"{p['namespace']}/{p['name']}" for p in listed["items"])


async def test_apply_wait_exits_10_naming_a_failed_proxy_and_why(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    path = manifest(tmp_path, "p.yaml", proxy("de-1", "gcp-eu"))
    assert (await cli("apply", "-f", path, "--nats-url", nats_server.url)).exit_code == 0
    failed = PhaseChanged(
        phase=Phase.FAILED,
        reason="ProviderFailed",
        message="create: unknown provider 'gcp-eu'; configured: local",
    )
    await jetstream_store.append(subjects.proxy(cli_uid("crawl", "de-1")), [NewEvent(failed, "f")])
    got = await cli("apply", "-f", path, "--wait", "--timeout", "60", "--nats-url", nats_server.url)
    assert got.exit_code == EXIT_NOT_DONE, got.output
    assert "crawl/de-1 (Failed: create: unknown provider 'gcp-eu'" in got.stderr
    assert got.stderr.startswith("error: failed: ")


async def test_apply_wait_waits_for_healthy_and_exits_10_when_it_stays_unhealthy(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> None:
    path = manifest(tmp_path, "p.yaml", proxy("de-1"))
    assert (await cli("apply", "-f", path, "--nats-url", nats_server.url)).exit_code == 0
    aggregate = subjects.proxy(cli_uid("crawl", "de-1"))
    ready = PhaseChanged(phase=Phase.READY, ip="127.0.0.1", url="http://127.0.0.1:3128")
    sick = HealthChanged(healthy=False, reason="ProbeFailed", message="connection refused")
    await jetstream_store.append(aggregate, [NewEvent(ready, "r"), NewEvent(sick, "s")])
    got = await cli("apply", "-f", path, "--wait", "--timeout", "1", "--nats-url", nats_server.url)
    assert got.exit_code == EXIT_NOT_DONE, got.output
    assert "not Ready and healthy within 1s: crawl/de-1 (Ready, unhealthy: connection refused)" in (
        got.stderr
    )
    await jetstream_store.append(aggregate, [NewEvent(HealthChanged(healthy=True), "h")])
    well = await cli(
        "apply", "-f", path, "--wait", "--timeout", "60", "--nats-url", nats_server.url
    )
    assert well.exit_code == 0, well.output


async def test_apply_applies_every_file_or_none(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    a = manifest(tmp_path, "a.yaml", proxy("a"))
    b = manifest(tmp_path, "b.yaml", proxy("b"))
    bad = manifest(tmp_path, "bad.yaml", proxy("c").replace("attributes", "atributes"))
    refused = await cli("apply", "-f", a, "-f", bad, "--nats-url", nats_server.url)
    assert refused.exit_code == 2, refused.output
    assert "bad.yaml" in refused.stderr
    assert await declared(nats_server.url) == []
    got = await cli("apply", "-f", a, "-f", b, "--nats-url", nats_server.url)
    assert got.exit_code == 0, got.output
    assert "proxy crawl/a created" in got.stdout
    assert "proxy crawl/b created" in got.stdout
    assert await declared(nats_server.url) == ["crawl/a", "crawl/b"]
    gone = await cli("delete", "-f", a, "-f", b, "--nats-url", nats_server.url)
    assert gone.exit_code == 0, gone.output
    assert gone.stdout.splitlines() == ["proxy crawl/a deleted", "proxy crawl/b deleted"]


async def test_apply_refuses_a_provider_the_last_gc_sweep_did_not_have(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    url = ("--nats-url", nats_server.url)
    unknown = manifest(tmp_path, "gcp.yaml", proxy("eu-1", "gcp-eu"))
    # No sweep in the log: the system cannot tell which providers it has, so apply goes on.
    blind = await cli(
        "apply", "-f", manifest(tmp_path, "blind.yaml", proxy("eu-0", "gcp-eu")), *url
    )
    assert blind.exit_code == 0, blind.output

    data = str(tmp_path / "data")
    swept = await cli("gc", "run-once", "--data-dir", data, *url, **NO_SECRET)
    assert swept.exit_code == 0, swept.output  # the GC records the providers it swept: local

    local = manifest(tmp_path, "local.yaml", proxy("de-1"))
    refused = await cli("apply", "-f", local, "-f", unknown, *url)
    assert refused.exit_code == 2, refused.output
    assert "crawl/eu-1: spec.provider 'gcp-eu': not a provider of the running system" in (
        refused.stderr
    )
    assert "had: local)" in refused.stderr
    assert await declared(nats_server.url) == ["crawl/eu-0"]  # neither file applied
    assert (await cli("apply", "-f", local, *url)).exit_code == 0
    forced = await cli("apply", "-f", unknown, "--no-provider-check", *url)
    assert forced.exit_code == 0, forced.output
    assert await declared(nats_server.url) == ["crawl/de-1", "crawl/eu-0", "crawl/eu-1"]


async def test_gc_run_once_next_to_up_finds_its_lease_secret(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    data = tmp_path / ".data"
    args = ("gc", "run-once", "--dry-run", "--data-dir", str(data), "--nats-url", nats_server.url)
    without = await cli(*args, **NO_SECRET)
    assert without.exit_code == 0, without.output
    assert "no lease secret" in without.stderr  # what the check below would see
    ensure_secret_file(data)  # as `up` keeps it
    beside_up = await cli(*args, **NO_SECRET)
    assert beside_up.exit_code == 0, beside_up.output
    assert "no lease secret" not in beside_up.stderr


async def test_gc_run_once_that_cannot_sweep_exits_12(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    lock = SweepLock(conn.js)
    held = await lock.try_acquire()  # another GC replica sweeping now
    assert held is not None
    try:
        got = await cli(
            "gc", "run-once", "--data-dir", str(tmp_path), "--nats-url", nats_server.url
        )
    finally:
        await lock.release(held)
    assert got.exit_code == EXIT_SWEEP_INCOMPLETE, got.output
    assert "another GC sweep holds the lock now" in got.stderr


async def test_lease_rotate_wait_that_does_not_finish_exits_11(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    await ready_proxy(jetstream_store, "de1", {"country": "de"}, port=3001)
    async with discovery(nats_server.url) as (_, base):
        env = {"DISCOVERY_URL": base}
        got = await cli("lease", "acquire", "-l", "country=de", "--ttl", "5m", "-o", "json", **env)
        assert got.exit_code == 0, got.output
        lease_id = json.loads(got.stdout)["id"]
        # No reconciler runs: the rotation is asked for and never gets further.
        rotated = await cli("lease", "rotate", lease_id, "--wait", "--timeout", "1s", **env)
    assert rotated.exit_code == EXIT_ROTATION_NOT_DONE, rotated.output
    assert "after 1s" in rotated.stderr


async def test_a_provider_removed_from_the_config_is_refused_after_the_next_sweep(
    nats_server: EmbeddedNatsServer, conn: Connection, tmp_path: Path
) -> None:
    """Only the newest sweep counts: an older one's providers are no longer the system's."""
    url = ("--nats-url", nats_server.url)

    def config(*names: str) -> str:
        entries = "".join(
            f"  - name: {n}\n    type: local\n    local: {{dataDir: {tmp_path / n}}}\n"
            for n in names
        )
        return manifest(tmp_path, f"providers-{len(names)}.yaml", f"providers:\n{entries}")

    async def sweep(providers: str) -> None:
        swept = await cli("gc", "run-once", "--providers-config", providers, *url, **NO_SECRET)
        assert swept.exit_code == 0, swept.output

    spare = manifest(tmp_path, "spare.yaml", proxy("sp-1", "spare"))
    await sweep(config("local", "spare"))
    accepted = await cli("apply", "-f", spare, *url)
    assert accepted.exit_code == 0, accepted.output
    await sweep(config("local"))  # `spare` removed from the config
    refused = await cli("apply", "-f", spare, *url)
    assert refused.exit_code == 2, refused.output
    assert "spec.provider 'spare': not a provider of the running system" in refused.stderr
    assert "had: local)" in refused.stderr
