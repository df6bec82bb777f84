"""Runs the reconciler's commands against providers and records what came of them.

Every answer is a fact about one command: its msg id derives from the proxy uid, the command id
and what happened, and its causation id is the command's msg id. Before touching a provider the
handler reads the aggregate and stops if an answer has already concluded the command (the rule
is ``projections.commands``, shared with the reconciler), so a redelivery (after a crash, a lost
ack, a delayed retry) neither stores nor creates anything twice. The one window a read cannot
close, a crash between ``provider.create`` and the append of ``InstanceCreated``, is closed by
the provider: create is idempotent on the deterministic instance name.

Waiting is durable: while an instance is Pending the handler returns ``Retry(delay)``, a delayed
redelivery JetStream keeps, never an in-memory timer that a crash would forget. The create
timeout is measured from the JetStream timestamp of ``InstanceCreated``, so a restart does not
reset it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import structlog
from prometheus_client import CollectorRegistry, Counter

from events import subjects
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    InstanceCreated,
    InstanceGone,
    InstanceObserved,
    InstanceState,
    ObserveInstance,
    ProviderFailed,
    ProxyDeclared,
)
from events.store import EventStore, History, NewEvent, Recorded, derive_msg_id
from projections.commands import Answer, Command, answers_to, concludes
from projections.proxy import ProxyView, fold
from services.executor.fences import FenceFloors
from services.providers.base import (
    CreateRequest,
    Instance,
    NotFound,
    Provider,
    ProviderError,
)
from services.runtime.consumer import Delivery, Outcome, Retry
from services.runtime.metrics import Metrics, default_metrics, metric_set

log = structlog.get_logger("egress.executor")

# States in which an instance will not become Running by waiting: the reconciler must act.
_SETTLED = (InstanceState.STOPPED, InstanceState.TERMINATING)


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """How long the durable waits are. Production keeps the defaults; tests shrink them."""

    poll_initial: float = 0.5
    poll_max: float = 5.0
    poll_growth: float = 1.5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    quota_delay: float = 60.0
    create_timeout: float = 600.0
    retry_for: float = 600.0
    """How long transient failures are retried before the command is answered Transient, so
    the reconciler hears of a provider that has been failing for a while instead of silence."""

    def poll_delay(self, attempt: int) -> float:
        """Polls start fast (most instances run within seconds) and slow down for slow ones."""
        return min(self.poll_max, self.poll_initial * self.poll_growth ** min(attempt - 1, 60))

    def backoff(self, attempt: int) -> float:
        """Exponential, so a struggling provider API is not hammered by every waiting command."""
        return min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 60))


def observed(command_id: str, provider: str, instance: Instance) -> InstanceObserved:
    return InstanceObserved(
        command_id=command_id,
        provider=provider,
        provider_id=instance.provider_id,
        state=instance.state,
        ip=instance.ip,
        url=instance.url,
        instance_uid=instance.instance_uid,
        created_at=instance.created_at.isoformat(),
    )


_OPERATION: dict[type[Event], str] = {
    CreateInstance: "create",
    DeleteInstance: "delete",
    ObserveInstance: "get",
}


ANSWERS = InstanceCreated.category
"""The category of every answer to a command (a test checks each ``Answer`` type)."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _outcome_counter(registry: CollectorRegistry) -> Counter:
    return Counter(
        "egress_executor_commands_total",
        "Command deliveries handled by the executor, by command type and outcome",
        ["command", "outcome"],
        registry=registry,
    )


def _outcomes(metrics: Metrics) -> Counter:
    """One counter per registry: ``up`` runs one registry per process, tests one per test."""
    return metric_set(metrics.registry, _outcome_counter)


@dataclass(slots=True)
class _Job:
    """One delivery of one command, and the answers known so far (kept current as we append,
    so a decision later in the same delivery sees what an earlier step recorded)."""

    uid: str
    command: Command
    causation: str
    attempt: int
    issued: datetime
    history: History
    """The proxy's ``instance`` events after the command: its answers so far."""
    answers: list[Answer] = field(default_factory=list)
    view: ProxyView | None = None
    """The proxy as its declarations say (its names), for a create."""
    fence_floor: int = 0

    @property
    def kind(self) -> str:
        return type(self.command).__name__


class CommandHandler:
    """The consumer handler for ``proxy.*.cmd``."""

    def __init__(
        self,
        store: EventStore,
        providers: Mapping[str, Provider],
        *,
        policy: CommandPolicy | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = _utcnow,
        fences: FenceFloors | None = None,
    ) -> None:
        self.store = store
        self.fences = fences or FenceFloors(store)
        self.providers = providers
        self.policy = policy or CommandPolicy()
        self.outcomes = _outcomes(metrics or default_metrics())
        self.clock = clock

    async def __call__(self, delivery: Delivery) -> Outcome:
        command = delivery.recorded.event
        if not isinstance(command, Command):
            return None  # only commands belong on proxy.*.cmd; nothing here to act on
        uid = subjects.proxy_uid_of(delivery.recorded.subject)
        job = await self._job(uid, command, delivery)
        if any(concludes(a) for a in job.answers):
            self._count(job, "already-answered")
            return None
        provider = self.providers.get(command.provider)
        if provider is None:
            configured = ", ".join(sorted(self.providers)) or "none"
            await self._append(
                job,
                self._failure(
                    job,
                    _OPERATION[type(command)],
                    ErrorClass.PERMANENT,
                    f"unknown provider {command.provider!r}; configured: {configured}",
                ),
                "unknown-provider",
            )
            self._count(job, "unknown-provider")
            return None
        match command:
            case CreateInstance():
                return await self._create(job, command, provider)
            case DeleteInstance():
                return await self._delete(job, command, provider)
            case ObserveInstance():
                return await self._observe(job, command, provider)

    async def _job(self, uid: str, command: Command, delivery: Delivery) -> _Job:
        """What the command needs to know, read at once: its answers (the proxy's ``instance``
        events after the command: an answer is appended after its command), and for a create the
        proxy's names and fence floor. Two or three literal subjects, not the whole proxy:
        each costs the server the same at any fleet size (docs/benchmarks.md, "Proxy
        lifecycle")."""
        after = delivery.recorded.seq
        answered = self.store.read(subjects.proxy_category(uid, ANSWERS), after_seq=after)
        if isinstance(command, CreateInstance):
            history, declared, floor = await asyncio.gather(
                answered,
                self.store.read(subjects.proxy_category(uid, ProxyDeclared.category)),
                self.fences.floor(uid),
            )
            view, fence_floor = fold(declared.events), floor
        else:
            history, view, fence_floor = await answered, None, 0
        return _Job(
            uid=uid,
            command=command,
            causation=delivery.recorded.msg_id,
            attempt=delivery.attempt,
            issued=delivery.recorded.timestamp,
            history=history,
            answers=answers_to(history.events, command.command_id),
            view=view,
            fence_floor=fence_floor,
        )

    # ---------------------------------------------------------------------------- create

    async def _create(self, job: _Job, cmd: CreateInstance, provider: Provider) -> Outcome:
        created = _created_record(job.history, cmd.command_id)
        if created is None:
            # The floor was read before the create, so the new instance starts fenced at the
            # proxy's highest granted token (docs/decisions/0092-nobody-who-reaches-a-proxy.md).
            try:
                provider_id = await provider.create(self._request(job, cmd))
            except ProviderError as exc:
                return await self._failed(job, "create", exc)
            await self._append(
                job,
                InstanceCreated(
                    command_id=cmd.command_id, provider=cmd.provider, provider_id=provider_id
                ),
                "created",
            )
            since = self.clock()  # within the round trip of the append's own timestamp
        else:
            assert isinstance(created.event, InstanceCreated)
            provider_id, since = created.event.provider_id, created.timestamp
        try:
            instance = await provider.get(provider_id)
        except NotFound:
            return await self._gone(job, provider_id)
        except ProviderError as exc:
            return await self._failed(job, "get", exc, provider_id)
        if (instance.state is InstanceState.RUNNING and instance.ip) or instance.state in _SETTLED:
            await self._append(
                job, observed(cmd.command_id, cmd.provider, instance), f"observed-{instance.state}"
            )
            self._count(job, instance.state.lower())
            return None
        waited = (self.clock() - since).total_seconds()
        if waited >= self.policy.create_timeout:
            message = (
                f"not running after {waited:.0f} s (limit {self.policy.create_timeout:.0f} s); "
                f"last state {instance.state}"
            )
            await self._append(
                job,
                self._failure(job, "create", ErrorClass.TRANSIENT, message, provider_id),
                "timeout",
            )
            self._count(job, "timeout")
            log.warning("instance did not start in time", uid=job.uid, provider_id=provider_id)
            return None
        self._count(job, "pending")
        return Retry(self.policy.poll_delay(job.attempt), f"instance {instance.state}")

    def _request(self, job: _Job, cmd: CreateInstance) -> CreateRequest:
        view = job.view
        return CreateRequest(
            name=cmd.instance_name,
            owner_uid=job.uid,
            namespace=view.namespace if view else "",
            proxy_name=view.name if view else "",
            spec=cmd.spec,
            spec_hash=cmd.spec_hash,
            cloud_init=cmd.cloud_init,
            fence_floor=job.fence_floor,
        )

    # ---------------------------------------------------------------------------- delete

    async def _delete(self, job: _Job, cmd: DeleteInstance, provider: Provider) -> Outcome:
        provider_id = cmd.provider_id
        try:
            if job.attempt > 1:
                # A redelivery: an earlier delivery may have asked already; do not ask a cloud
                # API to delete, every few seconds, an instance that is shutting down anyway.
                instance = await provider.get(provider_id)
                if instance.state is InstanceState.TERMINATING:
                    return self._still_there(job, instance)
            await provider.delete(provider_id)
            instance = await provider.get(provider_id)
        except NotFound:
            return await self._gone(job, provider_id)
        except ProviderError as exc:
            return await self._failed(job, "delete", exc, provider_id)
        return self._still_there(job, instance)

    def _still_there(self, job: _Job, instance: Instance) -> Outcome:
        self._count(job, "pending")
        return Retry(self.policy.poll_delay(job.attempt), f"instance {instance.state}")

    # --------------------------------------------------------------------------- observe

    async def _observe(self, job: _Job, cmd: ObserveInstance, provider: Provider) -> Outcome:
        try:
            instance = await provider.get(cmd.provider_id)
        except NotFound:
            return await self._gone(job, cmd.provider_id)
        except ProviderError as exc:
            return await self._failed(job, "get", exc, cmd.provider_id)
        await self._append(job, observed(cmd.command_id, cmd.provider, instance), "observed")
        self._count(job, instance.state.lower())
        return None

    # --------------------------------------------------------------------------- answers

    async def _gone(self, job: _Job, provider_id: str) -> Outcome:
        gone = InstanceGone(
            command_id=job.command.command_id,
            provider=job.command.provider,
            provider_id=provider_id,
        )
        await self._append(job, gone, "gone")
        self._count(job, "gone")
        return None

    async def _failed(
        self, job: _Job, operation: str, exc: ProviderError, provider_id: str = ""
    ) -> Outcome:
        """Act on the error class alone, as the reconciler will."""
        error_class = exc.error_class
        fields = {
            "uid": job.uid,
            "command": job.kind,
            "operation": operation,
            "error_class": str(error_class),
            "error": str(exc),
            "attempt": job.attempt,
        }
        if error_class is ErrorClass.QUOTA_EXCEEDED:
            last = job.answers[-1] if job.answers else None
            if not (isinstance(last, ProviderFailed) and last.error_class is error_class):
                # The ordinal keeps a later, separate quota episode from being de-duplicated.
                failure = self._failure(job, operation, error_class, str(exc), provider_id)
                await self._append(job, failure, f"quota-{len(job.answers)}")
            log.warning("provider quota exceeded, retrying slowly", **fields)
            self._count(job, "quota")
            return Retry(max(self.policy.quota_delay, exc.retry_after), f"quota: {exc}")
        if error_class is ErrorClass.PERMANENT:
            failure = self._failure(job, operation, error_class, str(exc), provider_id)
            await self._append(job, failure, f"failed-{operation}")
            log.error("provider refused permanently", **fields)
            self._count(job, "permanent")
            return None
        # Transient, and NotFound where it is not an answer (it cannot be: every call that can
        # return it handles it): nothing to record, try again later, unless for too long.
        waited = (self.clock() - job.issued).total_seconds()
        if waited >= self.policy.retry_for:
            message = f"{operation} still failing after {waited:.0f} s: {exc}"
            failure = self._failure(job, operation, ErrorClass.TRANSIENT, message, provider_id)
            await self._append(job, failure, f"gave-up-{operation}")
            log.error("provider kept failing, giving up on the command", **fields)
            self._count(job, "gave-up")
            return None
        log.warning("provider call failed, will retry", **fields)
        self._count(job, "transient")
        # A throttled API says when to come back: earlier calls would only be refused again.
        delay = max(self.policy.backoff(job.attempt), exc.retry_after)
        return Retry(delay, f"{error_class}: {exc}")

    def _failure(
        self,
        job: _Job,
        operation: str,
        error_class: ErrorClass,
        message: str,
        provider_id: str = "",
    ) -> ProviderFailed:
        return ProviderFailed(
            command_id=job.command.command_id,
            provider=job.command.provider,
            operation=operation,
            error_class=error_class,
            message=message,
            provider_id=provider_id,
        )

    async def _append(self, job: _Job, event: Answer, what: str) -> None:
        """No optimistic concurrency: an answer is a fact about the command and depends on no
        state another writer could change."""
        msg_id = derive_msg_id("executor", job.uid, job.command.command_id, what)
        await self.store.append(subjects.proxy(job.uid), [NewEvent(event, msg_id, job.causation)])
        job.answers.append(event)

    def _count(self, job: _Job, outcome: str) -> None:
        self.outcomes.labels(job.kind, outcome).inc()


def _created_record(history: History, command_id: str) -> Recorded | None:
    for recorded in history.events:
        event = recorded.event
        if isinstance(event, InstanceCreated) and event.command_id == command_id:
            return recorded
    return None
