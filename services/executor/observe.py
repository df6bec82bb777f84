"""The observe sweep: notices instances that stopped or vanished behind our back.

Commands only cover what the reconciler asked for. A VM preempted at night or a pod deleted by
hand would otherwise stay ``Ready`` until health probes gave up on it, and health cannot tell
"slow" from "gone". So every interval the sweep asks the provider about every Ready instance and
records what changed, as ``InstanceGone`` or ``InstanceObserved``; the reconciler recreates.

Facts, not polls: an answer equal to the last recorded fact appends nothing, so a fleet of
healthy proxies costs provider calls but no events (the rule is ``pure.observation``). Appends
use optimistic concurrency on the sequence the sweep folded: if anything happened to the proxy
meanwhile (a replace, a delete), the observation may be stale, and the sweep drops it; the next
round looks again. A provider whose call fails is skipped for the round rather than judged on
part of an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog
from nats.js import JetStreamContext

from events import subjects
from events.errors import ConcurrencyError
from events.store import EventStore, NewEvent, derive_msg_id
from projections import proxy
from projections.proxy import ProxyView
from services.executor.pure.observation import observation, watched
from services.providers.base import Instance, NotFound, Provider, ProviderError
from services.runtime.aio import raise_if_cancelled
from services.runtime.eventlog.projector import Projector

log = structlog.get_logger("egress.executor.observe")


@dataclass
class SweepResult:
    checked: int = 0
    appended: int = 0
    conflicts: int = 0
    skipped_providers: set[str] = field(default_factory=set)


class ObserveSweep:
    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        providers: Mapping[str, Provider],
        *,
        concurrency: int = 16,
    ) -> None:
        self.store = store
        self.providers = providers
        self.concurrency = concurrency
        self.projector: Projector[ProxyView] = Projector(
            js, subjects.PROXY_STREAM, "proxy.*.*", proxy.apply
        )

    async def run(self, interval: float) -> None:
        try:
            while True:
                raise_if_cancelled()  # nats-py can swallow a cancellation inside a read
                try:
                    await self.sweep_once()
                except Exception as exc:
                    # A round that could not finish (NATS briefly away) is retried next interval;
                    # raising would end the service, command consumer included, over a blip.
                    log.warning("observe sweep failed", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(interval)
        finally:
            await self.projector.close()

    async def sweep_once(self) -> SweepResult:
        """One round over every Ready proxy."""
        await self.projector.catch_up()
        result = SweepResult()
        slots = asyncio.Semaphore(self.concurrency)
        candidates = [v for v in self.projector.views.values() if watched(v)]

        async def check(view: ProxyView) -> None:
            async with slots:
                answered, instance = await self._get(view, result)
            if answered:
                await self._record(view, instance, result)

        await asyncio.gather(*(check(v) for v in candidates))
        if result.appended or result.skipped_providers:
            log.info(
                "observe sweep",
                checked=result.checked,
                appended=result.appended,
                conflicts=result.conflicts,
                skipped_providers=sorted(result.skipped_providers),
            )
        return result

    async def _get(self, view: ProxyView, result: SweepResult) -> tuple[bool, Instance | None]:
        """Whether the provider answered, and its answer (None: NotFound)."""
        name = view.spec.provider
        provider = self.providers.get(name)
        if provider is None or name in result.skipped_providers:
            return False, None
        result.checked += 1
        try:
            return True, await provider.get(view.provider_id)
        except NotFound:
            return True, None
        except ProviderError as exc:
            result.skipped_providers.add(name)
            log.warning(
                "provider skipped for this sweep",
                provider=name,
                error_class=str(exc.error_class),
                error=str(exc),
            )
            return False, None

    async def _record(
        self, view: ProxyView, instance: Instance | None, result: SweepResult
    ) -> None:
        event = observation(view, instance)
        if event is None:
            return
        what = "gone" if instance is None else str(instance.state)
        msg_id = derive_msg_id(
            "executor", "observe", view.uid, view.provider_id, str(view.last_seq), what
        )
        try:
            await self.store.append(
                subjects.proxy(view.uid), [NewEvent(event, msg_id)], expected_seq=view.last_seq
            )
        except ConcurrencyError:
            result.conflicts += 1
            return
        result.appended += 1
        log.info(
            "instance changed behind our back",
            uid=view.uid,
            provider_id=view.provider_id,
            state=what,
        )
