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
from events.errors import ConcurrencyError
from events.schemas import (
    CreateInstance,
    DeleteInstance,
    ErrorClass,
    Event,
    InstanceCreated,
    InstanceGone,
    InstanceState,
    ObserveInstance,
    ProxyDeclared,
)
from events.store import EventStore, History, NewEvent, derive_msg_id
from projections.commands import Answer, Command, answers_to, concludes
from projections.proxy import ProxyView, fold
from services.executor.fences import FenceFloors
from services.executor.pure.answers import (
    Step,
    created_record,
    creating,
    failed,
    failure,
    observed,
    waiting,
)
from services.executor.pure.policy import CommandPolicy
from services.providers.base import CreateRequest, NotFound, Provider, ProviderError
from services.runtime.nats.consumer import Delivery, Outcome, Retry
from services.runtime.observability.metrics import Metrics, default_metrics, metric_set

log = structlog.get_logger("egress.executor")

_OPERATION: dict[type[Event], str] = {
    CreateInstance: "create",
    DeleteInstance: "delete",
    ObserveInstance: "get",
}


ANSWERS = InstanceCreated.category
"""The category of every answer to a command (a test checks each ``Answer`` type)."""

_FAILURES = {
    "quota": (False, "provider quota exceeded, retrying slowly"),
    "permanent": (True, "provider refused permanently"),
    "gave-up": (True, "provider kept failing, giving up on the command"),
    "transient": (False, "provider call failed, will retry"),
}
"""What the log says of a failure's outcome, and whether as an error."""


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
    last_seq: int = 0
    """The proxy's last sequence as far as this job knows: the command's, or the latest answer
    read or appended after it (what the next answer is appended expecting)."""

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
            message = f"unknown provider {command.provider!r}; configured: {configured}"
            answer = failure(command, _OPERATION[type(command)], ErrorClass.PERMANENT, message)
            return await self._take(job, Step("unknown-provider", answer, "unknown-provider"))
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
            last_seq=max(after, history.last_seq),
        )

    # ---------------------------------------------------------------------------- create

    async def _create(self, job: _Job, cmd: CreateInstance, provider: Provider) -> Outcome:
        created = created_record(job.history.events, cmd.command_id)
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
        step = creating(
            self.policy,
            cmd,
            provider_id,
            instance,
            attempt=job.attempt,
            since=since,
            now=self.clock(),
        )
        if step.outcome == "timeout":
            log.warning("instance did not start in time", uid=job.uid, provider_id=provider_id)
        return await self._take(job, step)

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
                    return await self._take(job, waiting(self.policy, job.attempt, instance))
            await provider.delete(provider_id)
            instance = await provider.get(provider_id)
        except NotFound:
            return await self._gone(job, provider_id)
        except ProviderError as exc:
            return await self._failed(job, "delete", exc, provider_id)
        return await self._take(job, waiting(self.policy, job.attempt, instance))

    # --------------------------------------------------------------------------- observe

    async def _observe(self, job: _Job, cmd: ObserveInstance, provider: Provider) -> Outcome:
        try:
            instance = await provider.get(cmd.provider_id)
        except NotFound:
            return await self._gone(job, cmd.provider_id)
        except ProviderError as exc:
            return await self._failed(job, "get", exc, cmd.provider_id)
        answer = observed(cmd.command_id, cmd.provider, instance)
        return await self._take(job, Step(instance.state.lower(), answer, "observed"))

    # --------------------------------------------------------------------------- answers

    async def _gone(self, job: _Job, provider_id: str) -> Outcome:
        gone = InstanceGone(
            command_id=job.command.command_id,
            provider=job.command.provider,
            provider_id=provider_id,
        )
        return await self._take(job, Step("gone", gone, "gone"))

    async def _failed(
        self, job: _Job, operation: str, exc: ProviderError, provider_id: str = ""
    ) -> Outcome:
        """The failure mapping (``pure.answers.failed``) on the error class alone, as the
        reconciler will act on it."""
        step = failed(
            self.policy,
            job.command,
            job.answers,
            operation,
            exc,
            provider_id=provider_id,
            attempt=job.attempt,
            since=job.issued,
            now=self.clock(),
        )
        severe, said = _FAILURES[step.outcome]
        (log.error if severe else log.warning)(
            said,
            uid=job.uid,
            command=job.kind,
            operation=operation,
            error_class=str(exc.error_class),
            error=str(exc),
            attempt=job.attempt,
        )
        return await self._take(job, step)

    async def _take(self, job: _Job, step: Step) -> Outcome:
        """Do what a decision says: append its answer, count its outcome, ack or wait."""
        if step.answer is not None:
            await self._append(job, step.answer, step.what)
        self._count(job, step.outcome)
        return None if step.retry is None else Retry(step.retry, step.reason)

    async def _append(self, job: _Job, event: Answer, what: str) -> None:
        """An answer is a fact about the command and depends on no state another writer could
        change, so a conflict never stops it. It is appended expecting the proxy's last
        sequence as the executor knows it (the command's, or its own latest answer's), because
        an answer stored with the server's check can be folded by the reconciler onto the state
        it kept, without reading the proxy (docs/decisions/0168-executor-facts-chained.md).
        When something else came in between (a health event, a declaration), the answer is
        appended without the check, as it always was, and the reconciler reads."""
        msg_id = derive_msg_id("executor", job.uid, job.command.command_id, what)
        aggregate, new = subjects.proxy(job.uid), [NewEvent(event, msg_id, job.causation)]
        try:
            result = await self.store.append(aggregate, new, expected_seq=job.last_seq)
        except ConcurrencyError:
            result = await self.store.append(aggregate, new)
        job.last_seq = result.last_seq or job.last_seq
        job.answers.append(event)

    def _count(self, job: _Job, outcome: str) -> None:
        self.outcomes.labels(job.kind, outcome).inc()
