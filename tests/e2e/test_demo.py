"""The README's demo, end to end: `up`, then `apply` five local proxies, traffic through each
(leased: a proxy serves only its lease's holder), `delete`. Everything is real: the CLI as
subprocesses, nats-server, Squid (or proxy.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime.ports import free_port
from tests.support.system import ROOT, cli, fetch_via, hello_target, processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

PROXIES = "\n---\n".join(
    f"""apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: demo-{i}, namespace: e2e}}
spec:
  provider: local
  attributes: {{slot: "{i}"}}
"""
    for i in range(5)
)


@pytest.fixture
def target() -> Iterator[str]:
    with hello_target() as url:
        yield url


async def test_up_apply_traffic_delete(tmp_path: Path, target: str) -> None:
    data_dir = tmp_path / "data"
    nats_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_URL", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.cli.main",
        "up",
        "--data-dir",
        str(data_dir),
        "--nats-port",
        str(nats_port),
        "--metrics-port",
        "0",
        "--api-port",
        str(api_port := free_port()),
        "--gateway-port",
        str(free_port()),
        "--observe-interval",
        "1",
        "--health-check-url",
        target,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    url = f"nats://127.0.0.1:{nats_port}"
    cli_env = {**env, "NATS_URL": url, "DISCOVERY_URL": f"http://127.0.0.1:{api_port}"}
    manifest = tmp_path / "proxies.yaml"
    manifest.write_text(PROXIES)
    try:
        assert up.stdout is not None
        banner = b""
        async with asyncio.timeout(60):
            while url.encode() not in banner:
                line = await up.stdout.readline()
                assert line, f"up exited early:\n{banner.decode()}"
                banner += line

        applied = await asyncio.to_thread(cli, "apply", "-f", str(manifest), "--wait", env=cli_env)
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert applied.stdout.count(" created") == 5
        # Into a pipe, one line per proxy and nothing else (no progress bar, no blank line).
        assert applied.stdout.splitlines() == [f"proxy e2e/demo-{i} created" for i in range(5)]

        listed = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
        assert listed.returncode == 0, listed.stderr
        items = json.loads(listed.stdout)["items"]
        assert sorted(i["name"] for i in items) == [f"demo-{i}" for i in range(5)]
        assert {i["phase"] for i in items} == {"Ready"}

        async def all_healthy() -> bool:
            got = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
            return {i["healthy"] for i in json.loads(got.stdout)["items"]} == {True}

        await until(all_healthy, timeout=60)
        assert len({i["url"] for i in items}) == 5
        for item in items:
            # Only a lease's holder may use a proxy (D84): its URL carries the credentials.
            with pytest.raises(urllib.error.HTTPError, match="407") as refused:
                await asyncio.to_thread(fetch_via, item["url"], target)
            refused.value.close()  # it holds the response's socket until closed
            slot = f"slot={item['attributes']['slot']}"
            got = await asyncio.to_thread(
                cli, "lease", "acquire", "--selector", slot, "--ttl", "60", "-o", "json",
                env=cli_env,
            )  # fmt: skip
            assert got.returncode == 0, got.stdout + got.stderr
            lease = json.loads(got.stdout)
            assert await asyncio.to_thread(fetch_via, lease["proxy"]["url"], target) == (
                "hello through the proxy"
            )
            released = await asyncio.to_thread(cli, "lease", "release", lease["id"], env=cli_env)
            assert released.returncode == 0, released.stdout + released.stderr

        story = await asyncio.to_thread(
            cli, "events", "--proxy", items[0]["uid"], "-o", "json", env=cli_env
        )
        types = [json.loads(line)["type"] for line in story.stdout.splitlines() if line.strip()]
        assert types[0] == "ProxyDeclared"
        assert "CreateInstance" in types
        assert "InstanceObserved" in types
        assert "PhaseChanged" in types[types.index("InstanceObserved") :]
        assert "HealthChanged" in types

        instances = data_dir / "local" / "instances"
        assert processes_mentioning(str(instances)), (
            "the proxies run as processes under the data dir"
        )
        deleted = await asyncio.to_thread(cli, "delete", "-f", str(manifest), "--wait", env=cli_env)
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert "" not in deleted.stdout.splitlines(), deleted.stdout
        assert processes_mentioning(str(instances)) == []
        assert not any(instances.iterdir())
        listed = await asyncio.to_thread(cli, "get", "-o", "json", env=cli_env)
        assert json.loads(listed.stdout)["items"] == []
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
            async with asyncio.timeout(30):
                await up.wait()
    assert up.returncode == 0
