"""What D139's checks cost the discovery service, before and after, in CPU of one process:

- **the sweep**: every replica's expiry sweep now also looks, for each active lease, whether its
  proxy is being deleted or left the lease's pool (``revocation.due``). Measured over views of
  N active leases on N Ready members, none due (the steady state): the expiry scan alone
  (before) against the expiry scan and the revocation scan (after), per active lease per pass.
- **a body with a target**: a report's body is decoded strictly (``bodies.strict_body``);
  ``target`` is now checked as a host (``pure.targets``). Measured per decode of a report body
  with a URL target, with the check (after) and without it (before, ``models._target`` made a
  no-op for the run).

The parser's JSON answer (``badrequest``) costs a request that parses one attribute store in
``data_received``; it is not measured.

Run: ``python -m bench.discovery_edges [--leases 10000] [--decodes 200000] [--rounds 5]
[--json FILE]``. Nothing is started: the views are filled in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import msgspec

from events.schemas import Phase, ProxySpec
from projections.lease import LeaseRecord, LeaseView
from projections.proxy import ProxyView
from services.discovery.http import models
from services.discovery.http.models import ReportRequest
from services.discovery.leasing.expiry import ExpirySweep
from services.discovery.leasing.revocation import due
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics

BODY = b'{"outcome": "blocked", "target": "https://shop.example.com/cart?id=17", "detail": "403"}'


@dataclass
class Figures:
    leases: int
    decodes: int
    rounds: int
    scan_before_ns: float
    """Per active lease per pass: the expiry scan alone."""
    scan_after_ns: float
    """Per active lease per pass: the expiry scan and the revocation scan."""
    due: int
    """Leases the revocation scan found due (0: the steady state measured)."""
    decode_before_ns: float
    decode_after_ns: float


def fleet(n: int) -> Views:
    """Views of ``n`` Ready members of the pool ``depool``, each leased from it for an hour."""
    views = Views(None, InMemoryEventStore(), snapshots=False)  # type: ignore[arg-type] # no JetStream: nothing is read
    now = datetime.now(UTC)
    spec = ProxySpec(provider="local", attributes={"pool": "depool", "country": "de"})
    for i in range(n):
        uid = f"p{i}"
        views.proxies.views[uid] = ProxyView(
            uid=uid, namespace="crawl", name=f"depool-{i}", spec=spec, phase=Phase.READY
        )
        record = LeaseRecord(
            lease_id=f"l{i}",
            proxy_uid=uid,
            acquired_at=now,
            expires_at=now + timedelta(hours=1),
            ttl_seconds=3600.0,
            fencing_token=i + 1,
            selector={"pool": "depool"},
        )
        views.leases.views[uid] = LeaseView(proxy_uid=uid, current=record, last_seq=i + 1)
    return views


def _best(rounds: int, run: Callable[[], None]) -> float:
    """The least disturbed round's seconds of process CPU."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def measure(leases: int, decodes: int, rounds: int) -> Figures:
    views = fleet(leases)
    sweep = ExpirySweep(InMemoryEventStore(), views, DiscoveryMetrics(Metrics().registry))
    loop = asyncio.new_event_loop()
    try:

        def expiry_only() -> None:
            loop.run_until_complete(sweep.sweep())

        before = _best(rounds, expiry_only)
        found: list[int] = []

        def both() -> None:
            loop.run_until_complete(sweep.sweep())
            found.append(len(due(views)))

        after = _best(rounds, both)
    finally:
        loop.close()
    decoder = msgspec.json.Decoder(ReportRequest)

    def decode_all() -> None:
        for _ in range(decodes):
            decoder.decode(BODY)

    checked = _best(rounds, decode_all)
    check = models._target
    models._target = lambda target: None  # the code before D139: a target is not checked
    try:
        unchecked = _best(rounds, decode_all)
    finally:
        models._target = check
    return Figures(
        leases=leases,
        decodes=decodes,
        rounds=rounds,
        scan_before_ns=before / leases * 1e9,
        scan_after_ns=after / leases * 1e9,
        due=max(found, default=0),
        decode_before_ns=unchecked / decodes * 1e9,
        decode_after_ns=checked / decodes * 1e9,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery_edges")
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--decodes", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    got = measure(args.leases, args.decodes, args.rounds)
    print(f"{got.leases} active leases, best of {got.rounds} rounds (process CPU):")
    print(
        f"  sweep per lease per pass: {got.scan_before_ns:.0f} ns before, "
        f"{got.scan_after_ns:.0f} ns after ({got.due} due)"
    )
    print(
        f"  report body decode: {got.decode_before_ns / 1000:.2f} us before, "
        f"{got.decode_after_ns / 1000:.2f} us after"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(asdict(got), out, indent=2)


if __name__ == "__main__":
    main()
