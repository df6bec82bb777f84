"""`up`'s resident memory: at start, with a fleet of local proxies Ready, and through a lease
churn (docs/benchmarks.md, "`up`'s memory").

`up` runs every service in one process beside its nats-server and its proxies; its RSS is what a
laptop demo pays. The run: `up` with its own data dir and ports; ``--proxies`` local proxies
applied and waited Ready; then ``--clients`` clients acquire, report and release leases through
the API for ``--seconds``, as a crawl does. `up`'s ``VmRSS`` is read when it has started (the
banner), once the fleet is Ready, every ``--sample`` seconds of the churn, and at the end, with
``VmHWM`` (the peak). Separately, what each cloud
client adds when imported (a configured provider of that type imports it; `up` with the local
provider alone must not).

    python -m bench.up_memory --proxies 40 --clients 32 --seconds 240
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from services.runtime.ports import free_port
from tests.support.system import stop_local_proxies

ROOT = Path(__file__).resolve().parent.parent
CLIENT_MODULES = {
    "aws": "aiobotocore.session",
    "digitalocean": "pydo",
    "hetzner": "hcloud",
    "gcp": "google.cloud.compute_v1",
    "kubernetes": "kubernetes_asyncio.client",
}
"""The cloud client each provider type imports when it is configured."""


def rss_mb(pid: int) -> tuple[float, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, MB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return round(found.get("VmRSS", 0.0), 1), round(found.get("VmHWM", 0.0), 1)


def import_cost(module: str, after: str = "") -> float:
    """RSS (MB) of a fresh interpreter after importing ``after`` then ``module``, less the
    RSS after ``after`` alone."""
    code = (
        "import resource, importlib, sys\n"
        f"[importlib.import_module(m) for m in {[after] if after else []!r}]\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"importlib.import_module({module!r})\n"
        "print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        return -1.0
    before, after_kb = (int(x) for x in done.stdout.split())
    return round((after_kb - before) / 1024, 1)


MANIFEST = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: m{n}, namespace: bench}}
spec:
  provider: local
  attributes: {{country: de}}
---
"""


async def churn(api: str, clients: int, seconds: float) -> int:
    """Acquire, report and release until ``seconds`` pass; the cycles completed."""
    deadline = time.monotonic() + seconds
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(base_url=api, timeout=30, trust_env=False) as http:
            while time.monotonic() < deadline:
                got = await http.post(
                    "/v1/leases",
                    json={"selector": {"country": "de"}, "ttlSeconds": 30, "holder": f"c{i}"},
                )
                if got.status_code != 201:
                    await asyncio.sleep(0.05)
                    continue
                lease = got.json()["id"]
                await http.post(f"/v1/leases/{lease}/report", json={"outcome": "success"})
                await http.delete(f"/v1/leases/{lease}")
                done += 1

    await asyncio.gather(*(one(i) for i in range(clients)))
    return done


async def ready(api: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=api, timeout=30, trust_env=False) as http:
        while time.monotonic() < deadline:
            items = (await http.get("/v1/proxies", params={"limit": 1000})).json()["items"]
            if len(items) == count and all(
                p["phase"] == "Ready" and p.get("available") for p in items
            ):
                return
            await asyncio.sleep(1)
    raise RuntimeError(f"{count} proxies not Ready and leasable within {timeout:g} s")


async def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    api_port, nats_port = free_port(), free_port()
    api = f"http://127.0.0.1:{api_port}"
    # `up` probes its local proxies against a target of its own, unless told another URL.
    env = {k: v for k, v in os.environ.items() if k != "HEALTH_CHECK_URL"}
    env["PYTHONPATH"] = str(ROOT)
    command = ["-m", "services.cli.main", "up", "--data-dir", str(work / "data")]
    command += ["--api-port", str(api_port), "--gateway-port", str(free_port())]
    command += ["--nats-port", str(nats_port), "--metrics-port", "0"]
    log = (work / "up.log").open("wb")
    up = await asyncio.create_subprocess_exec(
        sys.executable, *command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        while b"Ctrl-C" not in (work / "up.log").read_bytes():
            if up.returncode is not None:
                raise RuntimeError((work / "up.log").read_text()[-3000:])
            await asyncio.sleep(0.2)
        started = rss_mb(up.pid)
        manifest = work / "fleet.yaml"
        manifest.write_text("".join(MANIFEST.format(n=n) for n in range(args.proxies)))
        applied = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "services.cli.main", "apply", "-f", str(manifest)),
            cwd=ROOT,
            env={**env, "NATS_URL": f"nats://127.0.0.1:{nats_port}"},
        )
        if await applied.wait() != 0:
            raise RuntimeError("egress-proxies apply failed")
        await ready(api, args.proxies, timeout=args.ready_timeout)
        fleet = rss_mb(up.pid)
        samples: list[float] = []
        began = time.monotonic()
        task = asyncio.create_task(churn(api, args.clients, args.seconds))
        while not task.done():
            await asyncio.wait({task}, timeout=args.sample)
            samples.append(rss_mb(up.pid)[0])
        cycles = task.result()
        elapsed = time.monotonic() - began
        end = rss_mb(up.pid)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(up.wait(), 60)
        except TimeoutError:
            up.kill()
        log.close()
        stop_local_proxies(work / "data")  # they outlive `up` on purpose; the bench's must not
    return {
        "proxies": args.proxies,
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "cycles": cycles,
        "cycles_per_second": round(cycles / elapsed, 1) if elapsed else 0.0,
        "rss_mb": {"started": started[0], "fleet_ready": fleet[0], "end": end[0]},
        "peak_mb": end[1],
        "samples_mb": samples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.up_memory", description=__doc__)
    parser.add_argument("--proxies", type=int, default=40)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--sample", type=float, default=10.0)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-up-memory-") as tmp:
        doc = asyncio.run(measure(args, Path(tmp)))
    doc["imports_mb"] = {
        kind: import_cost(module, "services.cli.main") for kind, module in CLIENT_MODULES.items()
    }
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
