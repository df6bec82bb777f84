"""The probe scheduler: one small task per owned proxy, probing every ``intervalSeconds``.

Why a task per proxy rather than rounds over the fleet: each proxy has its own interval and
timeout, and a slow or dead proxy (a probe that waits out its timeout) must not delay the others.
A sleeping task costs a timer and a few hundred bytes; the probes themselves share one bounded
semaphore, so a burst (every proxy's first probe) cannot open thousands of sockets at once.
Start times are spread over the interval by a hash of the uid, so probes do not arrive in waves.

A proxy's connection is kept open between its probes only when its interval is at most
``keep_alive_seconds`` (``--health-keep-alive``): beyond that an idle connection costs more
memory than the connect it saves is worth (``probe_client``'s docstring, docs/benchmarks.md). An
``https`` check keeps its tunnel at any interval: a new one costs a CONNECT and a TLS handshake,
five times the CPU of a plain connect (D82).

A recheck (holders reported the proxy ``failed`` often enough, ``reports.FailedReports``) wakes
the proxy's own task, so its next probe happens at once and is then its turn: a proxy is never
probed twice in parallel, and a probe already in flight (or already woken) is the recheck.

Appends use optimistic concurrency on the sequence of the view the verdict was judged on, with an
id derived from that sequence and the verdict: if the proxy moved meanwhile (replaced, deleted,
a newer verdict) the append is refused and the next probe judges again on the newer view; two
replicas judging the same state (a handover) store one event.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace

from events import subjects
from events.errors import ConcurrencyError, EventStoreError
from events.schemas import HealthChanged, HealthCheck, Phase
from events.store import EventStore, NewEvent, derive_msg_id
from projections.proxy import ProxyView, probe_target, target_verdict
from services.health.egress import EgressChecker
from services.health.metrics import HealthMetrics
from services.health.probe_client import CheckUrl, ProbeClient, ProbeResult
from services.health.pure.refused import PAGE_LIMIT, refused_by_proxy, refused_message
from services.health.pure.verdict import (
    LATENCY_CHANGED,
    Known,
    Outcome,
    Streak,
    Thresholds,
    Verdict,
    judge,
)
from services.runtime.eventlog.projector import Projector
from services.runtime.observability.telemetry import tracer

log = structlog.get_logger("egress.health")
_tracer = tracer("egress_proxies.health")


DEFAULT_KEEP_ALIVE_SECONDS = 20.0
"""Plain-http probes at most this far apart share a kept-alive connection (D82)."""


def probed(view: ProxyView) -> bool:
    """Ready proxies with an address: anything else is not in service, nothing to judge."""
    return view.phase is Phase.READY and bool(view.url) and not view.deleting and not view.removed


def known(view: ProxyView) -> Known:
    """The recorded verdict, if the last one is about the current instance (a replacement
    starts over)."""
    verdict = target_verdict(view)  # a rotation's replacement is judged on its own (D85)
    if verdict is None:
        return Known()
    return Known(verdict.healthy, verdict.latency_ms)


def phase_of(uid: str) -> float:
    """Where in its interval a proxy is probed, in [0, 1): stable per uid."""
    digest = hashlib.blake2b(uid.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32


@dataclass
class _Slot:
    provider_id: str = ""
    proxy_url: str = ""
    streak: Streak = field(default_factory=Streak)
    last_probe: float = 0.0
    task: asyncio.Task[None] | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by a recheck: the task probes at once instead of sleeping until its turn."""
    probing: bool = False


class Prober:
    def __init__(
        self,
        store: EventStore,
        projector: Projector[ProxyView],
        client: ProbeClient,
        metrics: HealthMetrics,
        *,
        default_check_url: str,
        provider_check_urls: Mapping[str, str] | None = None,
        latency_band_ms: float = 0.0,
        concurrency: int = 256,
        trace_probes: bool = False,
        keep_alive_seconds: float = DEFAULT_KEEP_ALIVE_SECONDS,
        egress: EgressChecker | None = None,
    ) -> None:
        self.store = store
        self.egress = egress
        """Checks each probed instance's egress after a healthy probe, when due (None: off)."""
        self.projector = projector
        self.client = client
        self.metrics = metrics
        self.default_check_url = default_check_url
        self.provider_check_urls = dict(provider_check_urls or {})
        """Per provider instance name: the URL probed when the spec names none (``up`` points
        its local providers at a loopback target, so an offline demo is healthy)."""
        self.latency_band_ms = latency_band_ms
        self.trace_probes = trace_probes
        self.keep_alive_seconds = keep_alive_seconds
        self.probes: collections.Counter[str] = collections.Counter()
        """Probes sent per proxy uid by this replica (what the tests and the benchmark count)."""
        self.rechecks: collections.Counter[str] = collections.Counter()
        """Rechecks per proxy uid that woke its task (not those a probe in flight absorbed)."""
        self._gate = asyncio.Semaphore(concurrency)
        self._slots: dict[str, _Slot] = {}
        self._checks: dict[str, CheckUrl | str] = {}
        self._recorded: dict[str, tuple[int, Known]] = {}
        metrics.watch_age(self.oldest_probe_age)

    @property
    def owned(self) -> set[str]:
        return set(self._slots)

    def sync(self, owns: Callable[[str], bool]) -> None:
        """Probe exactly the Ready proxies ``owns`` accepts: start new ones, stop the rest."""
        wanted = {uid for uid, v in self.projector.views.items() if probed(v) and owns(uid)}
        for uid in set(self._slots) - wanted:
            self._stop(uid)
        for uid in wanted - set(self._slots):
            slot = self._slots[uid] = _Slot()
            slot.task = asyncio.create_task(self._loop(uid, slot), name=f"probe {uid}")
        self.metrics.owned.set(len(self._slots))

    async def close(self) -> None:
        tasks = [slot.task for slot in self._slots.values() if slot.task is not None]
        for uid in list(self._slots):
            self._stop(uid)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.egress is not None:
            await self.egress.close()
        await self.client.close()

    def oldest_probe_age(self) -> float:
        probed_at = [s.last_probe for s in self._slots.values() if s.last_probe]
        return asyncio.get_running_loop().time() - min(probed_at) if probed_at else 0.0

    def _stop(self, uid: str) -> None:
        slot = self._slots.pop(uid)
        if slot.task is not None:
            slot.task.cancel()
        if slot.proxy_url:
            self.client.forget(slot.proxy_url)
        self._recorded.pop(uid, None)
        if self.egress is not None:
            self.egress.stop(uid)

    def recheck(self, uid: str, streak: int, owns: Callable[[str], bool]) -> str | None:
        """Probe ``uid`` at once if this replica probes it: wake its task (``woken``), or let
        the probe already in flight or already woken count (``in_flight``). None when the
        proxy is not ours to probe (another replica owns it, or it is not Ready)."""
        slot = self._slots.get(uid)
        if slot is None or slot.task is None or not owns(uid):
            log.debug("failed reports on a proxy probed elsewhere", proxy_uid=uid, streak=streak)
            return None
        if slot.probing or slot.wake.is_set():
            result = "in_flight"
        else:
            slot.wake.set()
            self.rechecks[uid] += 1
            result = "woken"
        self.metrics.rechecks.labels(result).inc()
        log.info("health recheck after failed reports", proxy_uid=uid, streak=streak, probe=result)
        return result

    async def _loop(self, uid: str, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        view = self.projector.views.get(uid)
        interval = view.spec.health_check.interval_seconds if view else 1.0
        due = loop.time() + phase_of(uid) * interval
        while True:
            woken = await self._sleep(slot, due - loop.time())
            slot.probing = True
            try:
                interval = await self.probe_once(uid, slot)
            finally:
                slot.probing = False
            # A recheck was this proxy's turn, taken early: the next one is an interval later.
            due = loop.time() + interval if woken else max(due + interval, loop.time())

    @staticmethod
    async def _sleep(slot: _Slot, seconds: float) -> bool:
        """Sleep ``seconds`` or until a recheck wakes the slot; whether one did."""
        if seconds > 0 and not slot.wake.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await slot.wake.wait()
        woken = slot.wake.is_set()
        slot.wake.clear()
        return woken

    async def probe_once(self, uid: str, slot: _Slot) -> float:
        """Probe, judge, record; returns the interval until the next probe."""
        view = self.projector.views.get(uid)
        if view is None or not probed(view):
            return 1.0  # the next sync stops this task
        spec = view.spec.health_check
        target, target_url = probe_target(view)
        if slot.provider_id != target or slot.proxy_url != target_url:
            if slot.proxy_url:
                self.client.forget(slot.proxy_url)
            slot.provider_id, slot.proxy_url, slot.streak = target, target_url, Streak()
        check_url = self.check_url_for(view.spec.provider, spec)
        async with self._gate:
            result = await self._probe(uid, target_url, check_url, spec)
        slot.last_probe = asyncio.get_running_loop().time()
        self.probes[uid] += 1
        self.metrics.probes.labels(result.outcome).inc()
        if result.ok:
            self.metrics.latency.observe(result.latency_ms / 1000.0)
        after = self.projector.views.get(uid)
        if after is None or not probed(after) or probe_target(after)[0] != target:
            return spec.interval_seconds  # judged on an instance that is no longer current
        thresholds = Thresholds(
            spec.failure_threshold, spec.success_threshold, self.latency_band_ms
        )
        refused = await self._refused(target_url, check_url, spec, result)
        outcome = Outcome(
            result.ok, result.latency_ms, self._explain(result, check_url, spec, refused)
        )
        slot.streak, verdict = judge(self._known(uid, after), slot.streak, outcome, thresholds)
        if verdict is not None:
            await self._append(uid, after, verdict)
        if result.ok and self.egress is not None and self.egress.due(uid, after, target):
            self.egress.start(
                uid, after, (target, target_url), lambda: self.projector.views.get(uid)
            )
        return spec.interval_seconds

    def check_url_for(self, provider: str, spec: HealthCheck) -> str:
        return spec.url or self.provider_check_urls.get(provider) or self.default_check_url

    async def _refused(
        self, proxy_url: str, check_url: str, spec: HealthCheck, result: ProbeResult
    ) -> bool:
        """Whether a 403 is the proxy's own rules refusing the check URL (D134). A refused
        CONNECT says so itself; a plain 403 is fetched once more for its page, which costs a
        request only while the check fails that way."""
        if result.outcome == "tunnel_refused":
            return refused_by_proxy(result.outcome, result.status, detail=result.detail)
        if result.ok or result.status != 403:
            return False
        check = self._check(check_url)
        if isinstance(check, str):
            return False
        got = await self.client.fetch(proxy_url, check, spec.timeout_seconds, limit=PAGE_LIMIT)
        return refused_by_proxy(got.outcome, got.status, got.body)

    @staticmethod
    def _explain(
        result: ProbeResult, check_url: str, spec: HealthCheck, refused: bool = False
    ) -> str:
        """A failure names what was fetched and what changes it: an operator whose proxies
        are all unhealthy is most often probing a URL their network cannot reach, or one the
        proxy's own destination rules refuse (``refused``)."""
        if result.ok:
            return result.detail
        if result.outcome == "connect_error":
            # The proxy itself is not there: no check URL would help.
            return (
                f"{result.detail} (the proxy did not accept the connection: its process is down "
                "or its port is unreachable from the health service; a failed instance is "
                "replaced once the executor observes it)"
            )
        if result.status == 407:
            return (
                f"{result.detail} (the proxy refused the probe's credential: the health service "
                "and the executor must have the same lease secret)"
            )
        where = "spec.healthCheck.url" if spec.url else "spec.healthCheck.url or --health-check-url"
        if refused:
            return refused_message(result.detail, check_url, where)
        return f"{result.detail} (fetched {check_url} through the proxy; set {where} to change it)"

    def _known(self, uid: str, view: ProxyView) -> Known:
        """The log's verdict, or our own append the projection has not caught up with yet."""
        mine = self._recorded.get(uid)
        if mine is not None:
            if self.projector.last_seq < mine[0]:
                return mine[1]
            del self._recorded[uid]
        return known(view)

    async def _probe(
        self, uid: str, proxy_url: str, check_url: str, spec: HealthCheck
    ) -> ProbeResult:
        check = self._check(check_url)
        timeout = spec.timeout_seconds
        if isinstance(check, str):
            return ProbeResult(False, "protocol_error", 0.0, 0, check)
        keep_alive = check.tls or spec.interval_seconds <= self.keep_alive_seconds
        if not self.trace_probes:
            return await self.client.probe(proxy_url, check, timeout, keep_alive=keep_alive)
        # A root span: a probe is caused by the clock, not by whatever ran before it.
        with _tracer.start_as_current_span(
            "health.probe",
            context=otel_context.Context(),
            kind=trace.SpanKind.CLIENT,
            attributes={"proxy.uid": uid, "url.full": check.url, "http.request.method": "GET"},
        ) as span:
            result = await self.client.probe(proxy_url, check, timeout, keep_alive=keep_alive)
            span.set_attribute("health.result", result.outcome)
            span.set_attribute("health.latency_ms", round(result.latency_ms, 2))
            if result.status:
                span.set_attribute("http.response.status_code", result.status)
            if not result.ok:
                span.set_status(trace.Status(trace.StatusCode.ERROR, result.detail))
            return result

    def _check(self, url: str) -> CheckUrl | str:
        """Parsed once per distinct URL; an unusable URL is kept as its error message."""
        found = self._checks.get(url)
        if found is None:
            try:
                found = CheckUrl.parse(url)
            except ValueError as exc:
                found = str(exc)
            self._checks[url] = found
        return found

    async def _append(self, uid: str, view: ProxyView, verdict: Verdict) -> None:
        event = HealthChanged(
            healthy=verdict.healthy,
            reason=verdict.reason,
            message=verdict.message,
            latency_ms=verdict.latency_ms,
            provider_id=probe_target(view)[0],
        )
        msg_id = derive_msg_id(
            "health",
            uid,
            probe_target(view)[0],
            str(view.last_seq),
            str(verdict.healthy),
            verdict.reason,
        )
        try:
            result = await self.store.append(
                subjects.proxy(uid), [NewEvent(event, msg_id)], expected_seq=view.last_seq
            )
        except ConcurrencyError:
            self.metrics.events.labels("conflict").inc()
            return  # the proxy moved: the next probe judges on the newer view
        except EventStoreError as exc:
            self.metrics.events.labels("error").inc()
            log.warning("health verdict not recorded", proxy_uid=uid, error=str(exc))
            return
        self._recorded[uid] = (result.last_seq, Known(verdict.healthy, verdict.latency_ms))
        kind = "healthy" if verdict.healthy else "unhealthy"
        self.metrics.events.labels("latency" if verdict.reason == LATENCY_CHANGED else kind).inc()
        log.info(
            "health changed",
            proxy_uid=uid,
            healthy=verdict.healthy,
            reason=verdict.reason,
            message=verdict.message,
            latency_ms=verdict.latency_ms,
        )
