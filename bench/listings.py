"""Listings that page, at fleet scale: server CPU and bytes per request of the fleet page and of
``GET /v1/proxies``, with the unpaged listing beside them for comparison.

A store is filled fast with ``--proxies`` Ready, healthy proxies (``bench.scale_fleet``: the
histories the system writes, on a server without fsync), then served by the product's nats-server
configuration, and ``egress-proxies run discovery`` is started as a process as a deployment runs
it. Each figure is the discovery process's own CPU time (Linux ``/proc``) across ``--requests``
requests of one kind, divided by their number, and the bytes of one answer:

- ``fleet_first``: ``GET /ui`` (the page's first load, 100 rows);
- ``poll_unchanged``: ``GET /ui/live?since=`` with the token of the previous answer (a 204),
  ``--quiet-requests`` of them (it costs well under the process clock's 10 ms tick);
- ``poll_changed``: the same after ``--changes`` proxies of the page got a new health verdict
  (only their rows and the counts come back);
- ``fleet_filtered``: ``GET /ui?health=healthy`` (a filter every proxy matches: its page and
  its counts);
- ``api_filtered_all`` / ``api_filtered_none``: ``GET /v1/proxies?limit=500`` with
  ``healthy=true`` (every proxy matches) and with ``phase=Failed`` (none does): the page and
  the ``total`` of a filtered listing;
- ``api_page_first`` / ``api_page_middle``: ``GET /v1/proxies?limit=500``, the first page and
  one from the middle of the listing (via ``continue``);
- ``api_unpaged``: ``GET /v1/proxies`` as before, every proxy.

Before the first figure the process is left to settle (less than a tenth of a core over 2 s,
at most 2 minutes: the start-up's snapshots and folds are not what a request costs), and its
CPU per second with no request is reported beside the figures (``idle_cpu_ms_per_s``): each
figure includes that background share of its window.

Targets (the issue): the fleet page <= 100 ms of server CPU and <= 200 KB per poll at 10,000
proxies; ``GET /v1/proxies?limit=500`` <= 20 ms; a quiet poll <= 2 ms at 10^4 and at 10^5.

Run: ``python -m bench.listings [--proxies 10000] [--requests 50] [--quiet-requests 400]
[--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.scale_fleet import (
    History,
    cpu_seconds,
    fill_store,
    idle,
    load,
    product_server,
    proxy_uid,
    publish_fleet,
    ready_history,
    running,
    service_argv,
)
from events import subjects
from events.schemas import HealthChanged
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.ports import free_port

FLEET_CPU_MS = 100.0
POLL_BYTES = 200_000
API_PAGE_CPU_MS = 20.0
QUIET_POLL_CPU_MS = 2.0
PAGE = 500
SINCE = re.compile(r'data-since="([^"]+)"')
UID = re.compile(r'<tr data-uid="([^"]+)"')


@dataclass
class Figure:
    name: str
    requests: int
    cpu_ms: float
    """Discovery's CPU per request."""
    bytes: int
    """One answer's body."""
    status: int
    rows: int
    """Rows (HTML) or items (JSON) in one answer."""


@dataclass
class Report:
    proxies: int
    requests: int
    changes: int
    machine: str
    load_before: tuple[float, ...]
    load_after: tuple[float, ...] = ()
    quiet_requests: int = 0
    idle_cpu_ms_per_s: float = 0.0
    """The process's CPU per second with no request, after it settled: the background each
    figure's window includes."""
    figures: dict[str, Figure] = field(default_factory=dict)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


Call = Callable[[], Awaitable[httpx.Response]]


async def measure(pid: int, name: str, requests: int, call: Call) -> Figure:
    """``requests`` calls of ``call``; discovery's CPU across them, per request."""
    last = await call()  # warm: the first build of the rows is not what a poll costs
    before = cpu_seconds(pid)
    for _ in range(requests):
        last = await call()
    used = cpu_seconds(pid) - before
    text = last.text
    rows = len(UID.findall(text)) if "html" in last.headers.get("content-type", "") else 0
    if "json" in last.headers.get("content-type", ""):
        rows = len(last.json()["items"])
    return Figure(
        name, requests, round(used * 1000 / requests, 2), len(last.content), last.status_code, rows
    )


async def _ready(client: httpx.AsyncClient, proxies: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = await client.get("/v1/proxies", params={"limit": "1"})
            if got.status_code == 200 and got.json()["total"] >= proxies:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"discovery did not list {proxies} proxies in {timeout:.0f} s")
        await asyncio.sleep(0.5)


async def run(
    tmp: Path,
    proxies: int,
    requests: int,
    changes: int,
    timeout: float = 600.0,
    *,
    quiet_requests: int | None = None,
) -> Report:
    def fleet() -> Iterator[History]:
        for i in range(proxies):
            yield ready_history(proxy_uid(i), "http://127.0.0.1:3128")

    data = tmp / "nats"
    await fill_store(data, lambda conn: publish_fleet(conn.js, fleet()))
    report = Report(proxies, requests, changes, platform.platform(), load())
    report.quiet_requests = quiet_requests or requests
    async with product_server(data) as (server, conn):
        store = JetStreamEventStore(conn.nc, conn.js)
        port = free_port()
        argv = service_argv("discovery", server.url, 0, "--port", str(port))
        async with (
            running("discovery", argv, tmp / "discovery.log") as child,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client,
        ):
            await _ready(client, proxies, timeout)
            await client.get("/ui")  # the rows' first build, before the process settles
            report.idle_cpu_ms_per_s = round(await idle(child.pid) * 1000, 1)
            figures = report.figures
            figures["fleet_first"] = await measure(
                child.pid, "fleet_first", requests, lambda: client.get("/ui")
            )
            first = await client.get("/ui")
            since = SINCE.search(first.text)
            if since is None:
                raise RuntimeError("the fleet page carries no poll token")
            token = since.group(1)

            async def poll() -> httpx.Response:
                return await client.get("/ui/live", params={"since": token})

            figures["poll_unchanged"] = await measure(
                child.pid, "poll_unchanged", report.quiet_requests, poll
            )
            shown = UID.findall(first.text)[:changes]
            changed: list[httpx.Response] = []
            cpu = 0.0
            for round_ in range(requests):
                for n, uid in enumerate(shown):
                    verdict = HealthChanged(
                        healthy=True, reason="Probe", latency_ms=20.0 + round_ + n
                    )
                    await store.append(
                        subjects.proxy(uid), [NewEvent(verdict, f"bench-{uid}-{round_}")]
                    )
                await _seen(client, token, len(shown))
                before = cpu_seconds(child.pid)
                got = await poll()
                cpu += cpu_seconds(child.pid) - before
                changed.append(got)
                token = got.headers.get("x-fleet-poll", token)
            last = changed[-1]
            figures["poll_changed"] = Figure(
                "poll_changed",
                requests,
                round(cpu * 1000 / requests, 2),
                len(last.content),
                last.status_code,
                len(UID.findall(last.text)),
            )
            figures["fleet_filtered"] = await measure(
                child.pid,
                "fleet_filtered",
                requests,
                lambda: client.get("/ui", params={"health": "healthy"}),
            )
            for name, key, value in (("all", "healthy", "true"), ("none", "phase", "Failed")):
                figures[f"api_filtered_{name}"] = await measure(
                    child.pid, f"api_filtered_{name}", requests, _filtered(client, key, value)
                )
            figures["api_page_first"] = await measure(
                child.pid,
                "api_page_first",
                requests,
                lambda: client.get("/v1/proxies", params={"limit": str(PAGE)}),
            )
            middle = await _middle(client, proxies)
            figures["api_page_middle"] = await measure(
                child.pid,
                "api_page_middle",
                requests,
                lambda: client.get("/v1/proxies", params={"limit": str(PAGE), "continue": middle}),
            )
            unpaged = max(1, requests // 4)
            figures["api_unpaged"] = await measure(
                child.pid, "api_unpaged", unpaged, lambda: client.get("/v1/proxies")
            )
    report.load_after = load()
    report.targets = targets(report)
    return report


def _filtered(client: httpx.AsyncClient, key: str, value: str) -> Call:
    """A page of ``GET /v1/proxies`` filtered by ``key=value``."""
    return lambda: client.get("/v1/proxies", params={"limit": str(PAGE), key: value})


async def _seen(client: httpx.AsyncClient, token: str, rows: int) -> None:
    """Until the view has every new verdict: a poll answering ``rows`` changed rows (not timed).
    One changed row is not enough: on a busy machine the second verdict may not be folded yet."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = await client.get("/ui/live", params={"since": token})
        if got.status_code != 204 and len(UID.findall(got.text)) >= rows:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError("the changed proxies never reached the fleet page")


async def _middle(client: httpx.AsyncClient, proxies: int) -> str:
    """The ``continue`` of the page nearest the listing's middle."""
    token = ""
    for _ in range(max(1, proxies // PAGE // 2)):
        got = (
            await client.get(
                "/v1/proxies", params={"limit": str(PAGE), **({"continue": token} if token else {})}
            )
        ).json()
        if not got["continue"]:
            break
        token = got["continue"]
    return token


def targets(report: Report) -> dict[str, dict[str, Any]]:
    f = report.figures
    fleet = max(f["fleet_first"].cpu_ms, f["poll_changed"].cpu_ms, f["poll_unchanged"].cpu_ms)
    poll_bytes = max(f["fleet_first"].bytes, f["poll_changed"].bytes, f["poll_unchanged"].bytes)
    api = max(f["api_page_first"].cpu_ms, f["api_page_middle"].cpu_ms)
    quiet = f["poll_unchanged"].cpu_ms
    return {
        "quiet_poll_cpu_ms": {
            "value": quiet,
            "target": QUIET_POLL_CPU_MS,
            "met": quiet <= QUIET_POLL_CPU_MS,
        },
        "fleet_cpu_ms": {"value": fleet, "target": FLEET_CPU_MS, "met": fleet <= FLEET_CPU_MS},
        "poll_bytes": {"value": poll_bytes, "target": POLL_BYTES, "met": poll_bytes <= POLL_BYTES},
        "api_page_cpu_ms": {"value": api, "target": API_PAGE_CPU_MS, "met": api <= API_PAGE_CPU_MS},
    }


def render(report: Report) -> str:
    lines = [
        f"{report.proxies} proxies, {report.requests} requests each; load {report.load_before} -> "
        f"{report.load_after}; idle {report.idle_cpu_ms_per_s} ms CPU/s",
        f"{'request':<18}{'CPU ms/req':>12}{'bytes':>12}{'status':>8}{'rows':>8}",
    ]
    for fig in report.figures.values():
        lines.append(
            f"{fig.name:<18}{fig.cpu_ms:>12.2f}{fig.bytes:>12}{fig.status:>8}{fig.rows:>8}"
        )
    for name, target in report.targets.items():
        verdict = "met" if target["met"] else "NOT met"
        lines.append(f"{name}: {target['value']} (target {target['target']}): {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.listings", description=__doc__)
    parser.add_argument("--proxies", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--changes", type=int, default=5, help="proxies changed per poll")
    parser.add_argument(
        "--quiet-requests", type=int, default=400, help="polls with nothing new, measured"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-listings-") as tmp:
        report = asyncio.run(
            run(
                Path(tmp),
                args.proxies,
                args.requests,
                args.changes,
                quiet_requests=args.quiet_requests,
            )
        )
    print(render(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_json(), indent=2, default=str))


if __name__ == "__main__":
    main()
