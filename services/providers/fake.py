"""The in-memory provider (``type: fake``): a product provider, with the failure modes real
providers have, for demos, benchmarks and tests (D150).

A whole system runs on it without starting a single proxy process (``type: fake`` in
``--providers-config``; the benchmarks run their fleets on it). Services that call
providers (executor, gc, reconciler end-to-end tests) need a provider that is fast and
deterministic yet still behaves like the real ones: creation is asynchronous (Pending before
Running), instances can stop or vanish behind our back, calls fail with any class of the
taxonomy. ``FakeProvider`` models exactly that and records what it was asked, so a test can
assert on idempotency ("one real creation per name") and on the fleet size at its worst moment.

Tests import it from ``services.testing.provider``, with the variants only tests use.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated

import msgspec

from events.schemas import InstanceState
from services.providers.base import (
    CREATED_AT_LABEL,
    DEFAULT_PROXY_PORT,
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
    NotFound,
    ProviderError,
    Transient,
)
from services.providers.preflight import Finding

OPS = ("create", "get", "delete", "list")


class FakeFinding(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One finding a fake entry's preflight answers, as a cloud's would be written."""

    check: Annotated[str, msgspec.Meta(min_length=1)]
    ok: bool
    detail: str = ""
    fix: str = ""

    def __post_init__(self) -> None:
        # A failing finding without its fix is what the preflight exists to rule out.
        if not self.ok and not self.fix.strip():
            raise ValueError(f"finding {self.check!r} fails, so it needs a `fix`")


class FakePreflight(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``preflight:`` of a ``fake:`` block: the entry answers a preflight with ``findings``
    after ``delay`` seconds (a slow API), or raises ``Transient(error)`` when ``error`` is set
    (an API it cannot reach). Without the block the fake has nothing to check."""

    findings: tuple[FakeFinding, ...] = ()
    delay: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    error: str = ""


class FakeConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """The ``fake:`` block of a providers-config entry."""

    latency: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    pending_polls: Annotated[int, msgspec.Meta(ge=0)] = 0
    preflight: FakePreflight | None = None


@dataclass(slots=True)
class _Record:
    """What the fake knows about one live instance beyond its public ``Instance``."""

    polls: int = 0
    ip: str = ""


class FakeProvider:
    """An in-memory ``Provider``; see the module docstring for why it exists."""

    type = "fake"

    def __init__(
        self,
        name: str = "fake",
        *,
        latency: float = 0.0,
        pending_polls: int = 0,
        ip_prefix: str = "10.0.0.",
    ) -> None:
        self.name = name
        self.latency = latency
        self.pending_polls = pending_polls
        self.ip_prefix = ip_prefix
        self.calls: list[tuple[str, str]] = []
        self.instances: dict[str, Instance] = {}
        self.max_live_per_owner: dict[str, int] = {}
        self.created_total = 0
        self.closed = False
        self._records: dict[str, _Record] = {}
        self._live_count: dict[str, int] = {}
        self._injected: dict[str, deque[ProviderError]] = defaultdict(deque)

    @classmethod
    def from_config(cls, name: str, config: FakeConfig) -> FakeProvider:
        if config.preflight is not None:
            answer = config.preflight
            return FakeProviderWithPreflight(
                name,
                latency=config.latency,
                pending_polls=config.pending_polls,
                findings=[Finding(f.check, f.ok, f.detail, f.fix) for f in answer.findings],
                delay=answer.delay,
                error=Transient(answer.error) if answer.error else None,
            )
        return cls(name, latency=config.latency, pending_polls=config.pending_polls)

    # ---------------------------------------------------------------- test controls

    def inject(self, op: str, error: ProviderError, times: int = 1) -> None:
        """Raise ``error`` on the next ``times`` calls of ``op`` (create, get, delete or list)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")
        self._injected[op].extend([error] * times)

    def stop(self, provider_id: str) -> None:
        """The instance stops behind our back (a preempted VM, an OOM-killed pod)."""
        instance = self._live(provider_id)
        self.instances[provider_id] = replace(instance, state=InstanceState.STOPPED, ip="")

    def vanish(self, provider_id: str) -> None:
        """The instance disappears behind our back (deleted by hand, node lost)."""
        self._live(provider_id)
        self._forget(provider_id)

    def _forget(self, provider_id: str) -> None:
        """Drop an instance, keeping the live count per owner (a recount per create would make
        a 1,000-proxy benchmark quadratic in the fake)."""
        instance = self.instances.pop(provider_id, None)
        self._records.pop(provider_id, None)
        if instance is not None:
            self._live_count[instance.owner_uid] -= 1

    def live_per_owner(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for instance in self.instances.values():
            counts[instance.owner_uid] += 1
        return dict(counts)

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        await self._enter("create", request.name)
        provider_id = f"fake-{request.name}"
        if provider_id in self.instances:
            return provider_id
        self.created_total += 1
        created_at = datetime.now(UTC)
        self.instances[provider_id] = Instance(
            provider_id=provider_id,
            name=request.name,
            state=InstanceState.PENDING,
            owner_uid=request.owner_uid,
            created_at=created_at,
            instance_uid=str(uuid.uuid4()),
            labels={
                MANAGED_LABEL: "true",
                OWNER_LABEL: request.owner_uid,
                CREATED_AT_LABEL: created_at.isoformat(),
            },
        )
        self._records[provider_id] = _Record(ip=f"{self.ip_prefix}{self.created_total}")
        live = self._live_count[request.owner_uid] = self._live_count.get(request.owner_uid, 0) + 1
        high = self.max_live_per_owner.get(request.owner_uid, 0)
        self.max_live_per_owner[request.owner_uid] = max(high, live)
        return provider_id

    async def get(self, provider_id: str) -> Instance:
        await self._enter("get", provider_id)
        instance = self.instances.get(provider_id)
        if instance is None:
            raise NotFound(f"{self.name}: no instance {provider_id}")
        record = self._records[provider_id]
        record.polls += 1
        if instance.state is InstanceState.PENDING and record.polls > self.pending_polls:
            instance = replace(
                instance, state=InstanceState.RUNNING, ip=record.ip, port=DEFAULT_PROXY_PORT
            )
            self.instances[provider_id] = instance
        return instance

    async def delete(self, provider_id: str) -> None:
        await self._enter("delete", provider_id)
        self._forget(provider_id)

    async def list_by_tag(self) -> list[Instance]:
        await self._enter("list", self.name)
        return list(self.instances.values())

    async def close(self) -> None:
        self.closed = True

    # ---------------------------------------------------------------- internals

    async def _enter(self, op: str, subject: str) -> None:
        self.calls.append((op, subject))
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        injected = self._injected[op]
        if injected:
            # A fresh copy each time, so repeated raises do not pile tracebacks onto one object.
            raise copy.copy(injected.popleft())

    def _live(self, provider_id: str) -> Instance:
        try:
            return self.instances[provider_id]
        except KeyError:
            raise KeyError(f"{self.name}: no live instance {provider_id}") from None


class FakeProviderWithPreflight(FakeProvider):
    """A ``FakeProvider`` that is also a ``Preflight``, answering the findings it was given, so
    the preflight command and the start-up check are tested without a cloud. A subclass, so the
    plain fake stays a provider with nothing to check. ``error`` is raised instead of answering:
    a ``ProviderError`` for an API that refused the call, anything else for a bug."""

    def __init__(
        self,
        name: str = "fake",
        *,
        latency: float = 0.0,
        pending_polls: int = 0,
        findings: list[Finding] | None = None,
        delay: float = 0.0,
        error: Exception | None = None,
    ) -> None:
        super().__init__(name, latency=latency, pending_polls=pending_polls)
        self.findings = list(findings or [])
        self.delay = delay
        self.error = error

    async def preflight(self) -> list[Finding]:
        self.calls.append(("preflight", self.name))
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise copy.copy(self.error)
        return list(self.findings)
