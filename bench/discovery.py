"""Discovery API throughput against the appends it makes, over real HTTP against the API as its
own process.

A lease cycle (acquire, then release) is two durable JetStream appends, so it is measured against
raw ``js.publish`` of the same payload at the same concurrency, on the same server, in the same
run. Every round has four phases on one nats-server, one API process and one set of clients:

- *raw*: 32 publishers in the benchmark process, each ``js.publish`` of a real ``LeaseAcquired``
  payload with its envelope headers, back to back, to a stream configured exactly like ``LEASE``
  (file storage, ``sync_interval: always``) but under other subjects, so the API's lease view
  never sees them;
- *leases*: 32 HTTP clients running acquire+release cycles back to back;
- *paced*: the same cycles at half the saturated cycle rate of the round's *leases* phase, the
  latency a crawler sees when the API is busy but not overloaded (with 32 clients always
  waiting, the *leases* latency is mostly queueing: Little's law);
- *healthz*: ``GET /healthz`` on the same connections, for information: what the HTTP stack
  costs with no lease work at all.

Targets: lease cycles/s >= 0.7 x (raw appends/s / 2), the ratio taken within a round; paced
cycle p99 <= 5 ms. Raw and leases swap order every round (the load of a shared machine drifts
within a run); paced always follows leases, whose rate it needs. The CPU each process used in
each phase is reported too: it barely moves with the machine's load.

Race (``bench.discovery_race``): two API processes, 64 clients, one proxy; double leases must
be 0.

Run: ``python -m bench.discovery [--seconds S] [--rounds R] [--api-loop asyncio] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError
from rich.console import Console

from bench.discovery_race import Race, race
from bench.discovery_report import (
    Load,
    render,
    round_figures,
    summarise,
    verdicts,
)
from bench.discovery_worker import HttpConnection, Setup, setup
from bench.lifecycle_worker import cpu_seconds
from bench.loops import LOOPS
from events import codec, subjects
from events.schemas import LeaseAcquired
from services.discovery.service import APPEND_TIMEOUT
from services.runtime.eventlog.streams import STREAMS
from services.runtime.observability.logs import configure_logging

PACED_SHARE = 0.5
"""The paced phase runs at this share of the round's saturated cycle rate."""
PHASES = ("raw", "leases", "paced", "healthz")
RAW_STREAM = "BENCH_RAW"
RAW_SUBJECT = "bench-raw"
TTL_SECONDS = 60


# ---------------------------------------------------------------------------------- the work

Work = Callable[[int], Awaitable[None]]
"""One operation of client ``i``: it counts itself into its phase's ``Load``."""


def http_cycle(conns: list[HttpConnection], load: Load) -> Work:
    async def work(i: int) -> None:
        http = conns[i]
        started = time.perf_counter()
        body = {"ttlSeconds": TTL_SECONDS, "holder": f"crawler-{i}"}
        status, _, answer = await http.request("POST", "/v1/leases", body)
        load.requests += 1
        if status != 201:
            load.errors[str(status)] += 1
            return
        status = (await http.request("DELETE", f"/v1/leases/{json.loads(answer)['id']}"))[0]
        load.requests += 1
        if status != 204:
            load.errors[str(status)] += 1
            return
        load.cycles += 1
        load.latency_ms.append(1000 * (time.perf_counter() - started))

    return work


def http_healthz(conns: list[HttpConnection], load: Load) -> Work:
    async def work(i: int) -> None:
        started = time.perf_counter()
        status = (await conns[i].request("GET", "/healthz"))[0]
        load.requests += 1
        if status != 200:
            load.errors[str(status)] += 1
            return
        load.latency_ms.append(1000 * (time.perf_counter() - started))

    return work


@dataclass(frozen=True)
class RawPayload:
    """What the API appends for one acquire, built before the clock starts: the encoded event
    and its envelope headers. Each publish gets its own ``Nats-Msg-Id``, as each claim does."""

    payload: bytes
    headers: dict[str, str]


def lease_payload(holder: str = "crawler-0") -> RawPayload:
    """A ``LeaseAcquired`` as the API writes it for the benchmark's acquire (``Leases._claim``):
    the same fields, the same sizes."""
    event = LeaseAcquired(
        lease_id=str(uuid.uuid4()),
        proxy_uid="bench-0",
        holder=holder,
        ttl_seconds=float(TTL_SECONDS),
        requested_ttl_seconds=float(TTL_SECONDS),
        selector={},
        fencing_token=1,
        cooldown_seconds=0.0,
        deadline=datetime.now(UTC) + timedelta(seconds=APPEND_TIMEOUT + 1.0),
    )
    return RawPayload(codec.encode(event), codec.envelope_headers(event, uuid.uuid4().hex))


async def ensure_raw_stream(js: JetStreamContext) -> None:
    """A stream configured exactly like ``LEASE`` (same storage, limits, duplicate window) under
    subjects of its own: raw appends into ``LEASE`` itself would be folded by the API's view."""
    (spec,) = (s for s in STREAMS if s.name == subjects.LEASE_STREAM)
    raw = dataclasses.replace(spec, name=RAW_STREAM, subjects=(f"{RAW_SUBJECT}.*",))
    await js.add_stream(raw.config(replicas=1))


def raw_append(js: JetStreamContext, load: Load, tag: str) -> Work:
    """Plain ``js.publish``: no optimistic-concurrency headers, no store, no tracing."""
    template = lease_payload()
    sent = Counter[int]()

    async def work(i: int) -> None:
        sent[i] += 1
        headers = {**template.headers, codec.HDR_MSG_ID: f"{tag}-{i}-{sent[i]}"}
        started = time.perf_counter()
        try:
            await js.publish(
                f"{RAW_SUBJECT}.c{i}", template.payload, timeout=APPEND_TIMEOUT, headers=headers
            )
        except (nats.errors.Error, APIError) as exc:
            load.requests += 1
            load.errors[type(exc).__name__] += 1
            return
        load.requests += 1
        load.latency_ms.append(1000 * (time.perf_counter() - started))

    return work


async def drive(load: Load, clients: int, work: Work, seconds: float, pids: dict[str, int]) -> Load:
    """Every client repeats ``work`` until the deadline, back to back, or at ``load.pace``
    (cycles/s over all clients) if set; the clock stops with the last answer."""
    cpu0 = {who: cpu_seconds(pid) for who, pid in pids.items()}
    bench0, started = time.process_time(), time.perf_counter()
    deadline = started + seconds
    interval = clients / load.pace if load.pace else 0.0

    async def client(i: int) -> None:
        due = started + interval * i / clients  # spread out, not all at once
        while time.perf_counter() < deadline:
            if interval:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                due += interval
            await work(i)

    await asyncio.gather(*(client(i) for i in range(clients)))
    load.seconds = time.perf_counter() - started
    load.cpu = {who: cpu_seconds(pid) - cpu0[who] for who, pid in pids.items()}
    load.cpu["bench"] = time.process_time() - bench0
    return load


def order(r: int, phases: tuple[str, ...]) -> list[str]:
    """Raw and leases swap order every round; paced always follows leases (it needs their
    rate), and healthz goes first or last."""
    even = ("healthz", "raw", "leases", "paced")
    odd = ("leases", "paced", "raw", "healthz")
    return [p for p in (even if r % 2 == 0 else odd) if p in phases]


async def throughput(
    tmp: Path,
    *,
    clients: int,
    proxies: int,
    seconds: float,
    rounds: int,
    pace: float = 0.0,
    phases: tuple[str, ...] = PHASES,
    profile: Path | None = None,
    loop: str = "uvloop",
    info: dict[str, object] | None = None,
) -> list[dict[str, Load]]:
    """Rounds of the phases on one server, one API process and one set of connections. The
    paced phase runs at ``pace`` cycles/s, or with 0 at ``PACED_SHARE`` of the round's leases
    rate. ``info`` receives the API's event loop and HTTP protocol."""
    async with setup(tmp, proxies=proxies, apis=1, profile=profile, loop=loop) as running:
        if info is not None:
            info.update(api_loop=running.apis[0].loop, api_http=running.apis[0].http)
        await ensure_raw_stream(running.conn.js)
        conns = [await HttpConnection.open(running.apis[0].port) for _ in range(clients)]
        try:
            pids = running.pids()
            warm, warm_up = min(seconds, 1.0), Load("warm-up")  # not counted
            await drive(warm_up, clients, http_cycle(conns, warm_up), warm, pids)
            if "raw" in phases:
                await drive(warm_up, clients, raw_append(running.conn.js, warm_up, "w"), warm, pids)
            out: list[dict[str, Load]] = []
            for r in range(rounds):
                loads: dict[str, Load] = {}
                for name in order(r, phases):
                    load = Load(name)
                    if name == "paced":
                        saturated = loads["leases"].cycle_rate if "leases" in loads else 0.0
                        load.pace = pace or max(1.0, PACED_SHARE * saturated)
                    work = phase_work(name, running, conns, load, f"r{r}")
                    loads[name] = await drive(load, clients, work, seconds, pids)
                out.append(loads)
            return out
        finally:
            for http in conns:
                await http.close()


def phase_work(
    name: str, running: Setup, conns: list[HttpConnection], load: Load, tag: str
) -> Work:
    if name == "raw":
        return raw_append(running.conn.js, load, tag)
    if name == "healthz":
        return http_healthz(conns, load)
    return http_cycle(conns, load)


async def _main(args: argparse.Namespace) -> dict[str, object]:
    configure_logging("error")
    rounds: list[dict[str, Load]] = []
    races: list[Race] = []
    info: dict[str, object] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        if args.rounds:
            rounds = await throughput(
                Path(tmp) / "throughput",
                clients=args.clients,
                proxies=args.proxies,
                seconds=args.seconds,
                rounds=args.rounds,
                pace=args.pace,
                phases=tuple(args.phases),
                profile=args.profile,
                loop=args.api_loop,
                info=info,
            )
        for n in range(args.race_rounds):
            races.append(await race(Path(tmp) / f"race-{n}", grants=args.race_grants))
    load_after = os.getloadavg()
    summary = summarise(rounds) if rounds else {}
    api = f"API on {info.get('api_loop', '?')} + {info.get('api_http', '?')}"
    render(summary, races, Console(), title=f"discovery, {api}: median (min-max) over rounds")
    Console().print(
        f"load average (1, 5, 15 min): before {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after {', '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs"
    )
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": list(load_before),
            "load_after": list(load_after),
        },
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "api": info,
        "summary": summary,
        "targets": verdicts(summary) if summary else {},
        "rounds": [round_figures(r) for r in rounds],
        "races": [asdict(r) for r in races],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery", description=__doc__)
    parser.add_argument("--clients", type=int, default=32, help="HTTP clients and raw publishers")
    parser.add_argument("--proxies", type=int, default=64, help="more than --clients: no 503s")
    parser.add_argument("--seconds", type=float, default=5.0, help="per phase per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="cycles/s of the paced phase (default: half the round's saturated rate)",
    )
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=PHASES,
        default=list(PHASES),
        help="run only these (e.g. `--phases leases` to profile the lease cycle alone)",
    )
    parser.add_argument(
        "--api-loop", choices=LOOPS, default="uvloop", help="the API process's event loop"
    )
    parser.add_argument("--race-rounds", type=int, default=1)
    parser.add_argument("--race-grants", type=int, default=300)
    parser.add_argument("--profile", type=Path, help="cProfile stats file for the API process")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if "paced" in args.phases and "leases" not in args.phases and not args.pace:
        parser.error("--phases paced needs leases too (its rate), or a --pace")
    doc = asyncio.run(_main(args))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
