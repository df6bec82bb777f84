"""Checking what a site sees of each proxy: the echo URL fetched through it, the address placed
with the offline database, a new finding appended to ``proxy.<uid>.egress``, and a proxy whose
egress does not match replaced when its spec asks (docs/decisions/0111-verified-egress.md).

The prober calls ``EgressChecker.due`` after each probe that found the proxy healthy and starts
``check`` beside the probe loop when it is: an echo that hangs for its whole timeout must not
delay the next health probe. What is due: an instance with no finding (a proxy just Ready, a
rotation's replacement before the lease switches to it), and any instance checked longer than
``interval`` ago. A check that finds what the log already says appends nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec
import structlog

from commands.rotating import request_rotation
from events import subjects
from events.egress import EGRESS_MISMATCH, EgressChanged, EgressObserved
from events.errors import EventStoreError
from events.spec import OnMismatch
from events.store import EventStore, NewEvent, derive_msg_id
from projections import egress as judged
from projections.egress import EgressPolicy
from projections.proxy import ProxyView
from services.health.geoip import GeoLookup
from services.health.metrics import HealthMetrics
from services.health.probe_client import CheckUrl, ProbeClient
from services.health.pure.echo import ECHO_BODY_LIMIT, parse_echo
from services.health.pure.refused import refused_by_proxy, refused_message

log = structlog.get_logger("egress.health")

DEFAULT_ECHO_URL = "https://api.ipify.org/?format=json"
DEFAULT_INTERVAL = 600.0
DEFAULT_MAX_REPLACEMENTS = 3
TIMEOUT = 10.0


@dataclass
class EgressSettings:
    """``--egress-*``: where to ask, how often, and how findings are judged."""

    echo_url: str = DEFAULT_ECHO_URL
    provider_echo_urls: dict[str, str] = field(default_factory=dict)
    interval: float = DEFAULT_INTERVAL
    policy: EgressPolicy = field(default_factory=EgressPolicy)
    max_replacements: int = DEFAULT_MAX_REPLACEMENTS
    timeout: float = TIMEOUT

    def url_for(self, view: ProxyView) -> str:
        return (
            view.spec.egress_url or self.provider_echo_urls.get(view.spec.provider) or self.echo_url
        )


class EgressChecker:
    def __init__(
        self,
        store: EventStore,
        client: ProbeClient,
        lookup: Callable[[], GeoLookup],
        settings: EgressSettings,
        metrics: HealthMetrics,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.client = client
        self.lookup = lookup
        """Opened on first use (the bundled data takes a fifth of a second to load)."""
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.checked: dict[str, dict[str, datetime]] = {}
        """uid -> provider id -> when this replica last checked it (a check that appended
        nothing leaves no trace in the log). By uid first: forgetting a proxy is one pop, where
        a scan of every pair per proxy stopped took a replica of 10^5 proxies minutes."""
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.checks = 0

    def due(self, uid: str, view: ProxyView, provider_id: str) -> bool:
        task = self.tasks.get(uid)
        if task is not None and not task.done():
            return False
        last = self.checked.get(uid, {}).get(provider_id)
        if last is None:
            found = judged.finding(view, provider_id)
            last = found.checked_at if found is not None else None
        return last is None or (self.clock() - last).total_seconds() >= self.settings.interval

    def start(
        self,
        uid: str,
        view: ProxyView,
        target: tuple[str, str],
        latest: Callable[[], ProxyView | None],
    ) -> None:
        """Check the instance ``target`` (provider id, proxy URL) in a task of its own (one per
        proxy at a time); ``latest`` gives the view as it is when the answer comes."""
        provider_id, proxy_url = target
        self.checked.setdefault(uid, {})[provider_id] = self.clock()
        self.tasks[uid] = asyncio.create_task(
            self._checked(uid, view, provider_id, proxy_url, latest), name=f"egress {uid}"
        )

    async def _checked(
        self,
        uid: str,
        view: ProxyView,
        provider_id: str,
        proxy_url: str,
        latest: Callable[[], ProxyView | None],
    ) -> None:
        """``check`` as a task: nothing it meets may end the prober."""
        try:
            await self.check(uid, view, provider_id, proxy_url, latest)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("egress check failed", proxy_uid=uid)

    def stop(self, uid: str) -> None:
        task = self.tasks.pop(uid, None)
        if task is not None:
            task.cancel()
        self.checked.pop(uid, None)

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()

    async def check(
        self,
        uid: str,
        view: ProxyView,
        provider_id: str,
        proxy_url: str,
        latest: Callable[[], ProxyView | None] | None = None,
    ) -> EgressObserved:
        """One check of one instance; returns the finding (appended only when new)."""
        self.checks += 1
        event = await self._find(view, provider_id, proxy_url)
        self.metrics.egress_checks.labels("error" if event.error else "ok").inc()
        current = latest() if latest is not None else view
        before = judged.finding(current or view, provider_id)
        if not _same(before, event):
            if before is not None and before.ip and event.ip and before.ip != event.ip:
                event = EgressChanged(
                    **msgspec.structs.asdict(event),
                    old_ip=before.ip,
                    old_country=before.country,
                    old_asn=before.asn,
                )
            await self._append(uid, event, before)
        if current is not None:
            await self._replace_if_mismatched(uid, current, provider_id, event)
        return event

    async def _find(self, view: ProxyView, provider_id: str, proxy_url: str) -> EgressObserved:
        url = self.settings.url_for(view)
        at = self.clock()
        try:
            check = CheckUrl.parse(url)
        except ValueError as exc:
            return EgressObserved(provider_id=provider_id, error=str(exc), checked_at=at)
        got = await self.client.fetch(
            proxy_url, check, self.settings.timeout, limit=ECHO_BODY_LIMIT
        )
        if refused_by_proxy(got.outcome, got.status, got.body, got.detail):
            # The proxy works; its destination rules refuse the echo URL (D134).
            why = refused_message(got.detail or "HTTP 403", url, "--egress-echo-url")
            return EgressObserved(provider_id=provider_id, error=why, checked_at=at)
        if got.outcome != "ok":
            why = f"fetching the echo URL {url} through the proxy failed: {got.detail}"
            return EgressObserved(provider_id=provider_id, error=why, checked_at=at)
        answer = parse_echo(got.status, got.content_type, got.body)
        if answer.error:
            return EgressObserved(
                provider_id=provider_id, error=f"{url}: {answer.error}", checked_at=at
            )
        place = await asyncio.to_thread(self._place, answer.ip)
        return EgressObserved(
            provider_id=provider_id,
            ip=answer.ip,
            scope=answer.scope,
            country=place[0],
            asn=place[1],
            org=place[2],
            db=place[3],
            checked_at=at,
        )

    def _place(self, ip: str) -> tuple[str, int, str, str]:
        lookup = self.lookup()
        found = lookup.lookup(ip)
        return found.country, found.asn, found.org, lookup.db

    async def _append(self, uid: str, event: EgressObserved, before: judged.Egress | None) -> None:
        msg_id = finding_msg_id(uid, event, before.seq if before is not None else 0)
        try:
            await self.store.append(subjects.proxy(uid), [NewEvent(event, msg_id)])
        except EventStoreError as exc:
            self.metrics.egress_events.labels("error").inc()
            log.warning("egress finding not recorded", proxy_uid=uid, error=str(exc))
            return
        kind = "changed" if isinstance(event, EgressChanged) else "observed"
        self.metrics.egress_events.labels(kind).inc()
        log.info(
            "egress " + kind,
            proxy_uid=uid,
            provider_id=event.provider_id,
            ip=event.ip,
            country=event.country,
            asn=event.asn,
            org=event.org,
            error=event.error,
            old_ip=before.ip if before is not None else "",
        )

    async def _replace_if_mismatched(
        self, uid: str, view: ProxyView, provider_id: str, event: EgressObserved
    ) -> None:
        """``spec.egress.onMismatch: replace`` for the proxy's own instance (a replacement that
        does not match is judged once it takes over), within the bound."""
        if (
            view.spec.egress_rules.on_mismatch is not OnMismatch.REPLACE
            or provider_id != view.provider_id
        ):
            return
        found = judged.Egress(
            provider_id=provider_id, ip=event.ip, country=event.country, asn=event.asn
        )
        wrong = judged.mismatch(view, found, self.settings.policy)
        if not wrong or view.egress_replacements >= self.settings.max_replacements:
            return
        if view.rotation is not None and view.rotation.in_progress:
            return
        result = await request_rotation(
            self.store,
            uid,
            cause=f"egress-mismatch:{provider_id}",
            client="health",
            reason=EGRESS_MISMATCH,
        )
        self.metrics.egress_replacements.labels(result).inc()
        log.info("egress mismatch: replacing", proxy_uid=uid, mismatch=wrong, result=result)


def finding_msg_id(uid: str, event: EgressObserved, after_seq: int) -> str:
    """Two replicas that find the same after the same finding (a handover) store it once."""
    return derive_msg_id(
        "egress", uid, event.provider_id, str(after_seq), event.ip, event.error, event.db
    )


def _same(before: judged.Egress | None, event: EgressObserved) -> bool:
    """The log already says this: the same address, place, database and error."""
    if before is None:
        return False
    if event.error and not event.ip:
        return before.error == event.error  # still failing, for the same reason
    return (before.ip, before.scope, before.country, before.asn, before.org, before.db) == (
        event.ip,
        event.scope,
        event.country,
        event.asn,
        event.org,
        event.db,
    ) and before.error == event.error
