"""The provider contract (docs/architecture.md, The provider contract): every provider must
pass this same suite.

Subclasses provide three fixtures:

- ``provider``: the provider under test; the fixture deletes what the test left behind;
- ``make_request``: builds a ``CreateRequest`` for a short name (a provider shared between runs,
  such as a cloud project, maps it to a unique one);
- ``provoke``: calls that must fail, labelled, so the error taxonomy is checked with real errors
  of that provider (a forbidden name, exhausted capacity, an injected fault), not just NotFound.

Waits poll with a bounded deadline (``ready_timeout``) and assert on the outcome, never on how long
it took: a slow machine makes the suite slower, not red.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import ClassVar, Protocol, TypeVar

import pytest

from events.schemas import InstanceState, ProxySpec
from services.providers.base import (
    MANAGED_LABEL,
    NAME_LABEL,
    NAMESPACE_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
    NotFound,
    Permanent,
    Provider,
    ProviderError,
    QuotaExceeded,
    Transient,
)

TAXONOMY = (NotFound, QuotaExceeded, Transient, Permanent)
P = TypeVar("P", bound=Provider)
Provoke = Sequence[tuple[str, Callable[[], Awaitable[object]]]]


class MakeRequest(Protocol):
    def __call__(self, name: str, owner_uid: str = "owner-1") -> CreateRequest: ...


def request_factory(provider_name: str, prefix: str = "") -> MakeRequest:
    """The usual ``make_request``: ``prefix`` keeps names unique where providers are shared."""

    def make(name: str, owner_uid: str = "owner-1") -> CreateRequest:
        return CreateRequest(
            name=f"{prefix}{name}",
            owner_uid=owner_uid,
            namespace="default",
            proxy_name=name,
            spec=ProxySpec(provider=provider_name),
            spec_hash="h1",
        )

    return make


async def delete_all(provider: Provider) -> None:
    """Teardown for ``provider`` fixtures: nothing a test created may outlive it."""
    for instance in await provider.list_by_tag():
        await provider.delete(instance.provider_id)


@asynccontextmanager
async def closing(provider: P) -> AsyncIterator[P]:
    """A provider a test makes for itself, closed after even when the test failed: an open
    client's sockets outlive the test and fail a later one (warnings are errors)."""
    try:
        yield provider
    finally:
        await provider.close()


@asynccontextmanager
async def owned(provider: P) -> AsyncIterator[P]:
    """The body of a ``provider`` fixture (``async with owned(...) as made: yield made``): what
    the test left is deleted (``delete_all``), then the provider closed, even after a failure."""
    async with closing(provider):
        try:
            yield provider
        finally:
            await delete_all(provider)


def assert_classified(exc: BaseException) -> None:
    assert isinstance(exc, ProviderError), f"{exc!r} is outside the taxonomy"
    matches = [cls for cls in TAXONOMY if isinstance(exc, cls)]
    assert len(matches) == 1, f"{exc!r} is in {len(matches)} classes: {matches}"
    assert exc.error_class is matches[0].error_class


class ProviderContract:
    ready_timeout: ClassVar[float] = 60.0

    async def running(self, provider: Provider, provider_id: str) -> Instance:
        """Poll until Running; fail only when the deadline passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            instance = await provider.get(provider_id)
            if instance.state is InstanceState.RUNNING:
                return instance
            if loop.time() >= deadline:
                pytest.fail(f"{provider_id} not Running within {self.ready_timeout}s: {instance}")
            await asyncio.sleep(0.05)

    async def gone(self, provider: Provider, provider_id: str) -> None:
        """Poll until get answers NotFound (a provider may show Terminating meanwhile)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            try:
                instance = await provider.get(provider_id)
            except NotFound:
                return
            if loop.time() >= deadline:
                pytest.fail(f"{provider_id} still there after {self.ready_timeout}s: {instance}")
            await asyncio.sleep(0.05)

    async def listed(self, provider: Provider, provider_id: str) -> Instance | None:
        return next((i for i in await provider.list_by_tag() if i.provider_id == provider_id), None)

    # ---------------------------------------------------------------- create

    async def test_create_returns_an_id_and_is_idempotent(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        request = make_request("c1")
        first = await provider.create(request)
        assert first
        assert await provider.create(request) == first
        mine = [i for i in await provider.list_by_tag() if i.name == request.name]
        assert [i.provider_id for i in mine] == [first]

    async def test_concurrent_creates_make_one_instance(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        request = make_request("c2")
        ids = await asyncio.gather(*(provider.create(request) for _ in range(4)))
        assert len(set(ids)) == 1
        mine = [i for i in await provider.list_by_tag() if i.name == request.name]
        assert len(mine) == 1

    async def test_two_names_are_two_instances(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        a = await provider.create(make_request("c3a"))
        b = await provider.create(make_request("c3b"))
        assert a != b
        running_a, running_b = await self.running(provider, a), await self.running(provider, b)
        assert running_a.url != running_b.url
        await provider.delete(a)
        await self.gone(provider, a)
        assert (await self.running(provider, b)).url == running_b.url

    async def test_a_create_with_a_fence_floor_makes_the_same_instance(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        """The executor hands every create the proxy's highest granted fencing token
        (docs/decisions/0092-nobody-who-reaches-a-proxy.md): a provider takes it like any other
        request."""
        request = dataclasses.replace(make_request("c4"), fence_floor=41)
        first = await provider.create(request)
        assert await provider.create(request) == first
        assert (await self.running(provider, first)).url

    # ---------------------------------------------------------------- get

    async def test_instance_becomes_running_with_an_address(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        request = make_request("g1", owner_uid="owner-g1")
        provider_id = await provider.create(request)
        instance = await self.running(provider, provider_id)
        assert instance.provider_id == provider_id
        assert instance.name == request.name
        assert instance.owner_uid == "owner-g1"
        assert instance.ip
        assert instance.url == f"http://{instance.ip}:{instance.port}"
        assert instance.created_at.utcoffset() == timedelta(0)
        again = await provider.get(provider_id)
        assert again.created_at == instance.created_at
        assert again.instance_uid == instance.instance_uid

    async def test_get_unknown_is_not_found(self, provider: Provider) -> None:
        with pytest.raises(NotFound) as caught:
            await provider.get("never-created-0")
        assert_classified(caught.value)

    # ---------------------------------------------------------------- delete

    async def test_delete_is_idempotent_then_not_found(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        provider_id = await provider.create(make_request("d1"))
        await provider.delete(provider_id)
        await provider.delete(provider_id)
        await self.gone(provider, provider_id)
        await provider.delete(provider_id)
        with pytest.raises(NotFound):
            await provider.get(provider_id)

    async def test_delete_of_unknown_is_not_an_error(self, provider: Provider) -> None:
        await provider.delete("never-created-1")

    async def test_create_after_delete_is_a_new_instance(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        request = make_request("d2")
        first = await self.running(provider, await provider.create(request))
        await provider.delete(first.provider_id)
        await self.gone(provider, first.provider_id)
        second = await self.running(provider, await provider.create(request))
        assert second.name == request.name
        if first.instance_uid and second.instance_uid:
            assert second.instance_uid != first.instance_uid

    # ---------------------------------------------------------------- list

    async def test_list_by_tag_shows_owner_and_creation_time(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        provider_id = await provider.create(make_request("l1", owner_uid="owner-l1"))
        listed = await self.listed(provider, provider_id)
        assert listed is not None
        assert listed.owner_uid == "owner-l1"
        assert listed.created_at.utcoffset() == timedelta(0)
        assert listed.labels[MANAGED_LABEL] == "true"
        assert listed.labels[OWNER_LABEL] == "owner-l1"
        await provider.delete(provider_id)
        await self.gone(provider, provider_id)
        assert await self.listed(provider, provider_id) is None

    # ---------------------------------------------------------------- errors

    async def test_errors_are_exactly_one_class(self, provider: Provider, provoke: Provoke) -> None:
        assert provoke, "give at least one call that fails"
        for label, call in provoke:
            with pytest.raises(ProviderError) as caught:
                await call()
            assert_classified(caught.value)
            assert caught.value.args, f"{label}: the error must say what went wrong"


class CarriesIdentity:
    """For the providers whose instances an operator meets in a cloud's console (every cloud,
    and kvm): the instance carries its proxy's namespace and name beside the uid, read back as
    labels (docs/decisions/0147-the-cli-as-one-language.md). Mixed into their contract class."""

    async def test_an_instance_carries_its_proxys_namespace_and_name(
        self, provider: Provider, make_request: MakeRequest
    ) -> None:
        request = dataclasses.replace(make_request("n1"), namespace="crawl", proxy_name="de-1")
        provider_id = await provider.create(request)
        listed = await ProviderContract().listed(provider, provider_id)
        assert listed is not None
        assert (listed.labels[NAMESPACE_LABEL], listed.labels[NAME_LABEL]) == ("crawl", "de-1")
        assert listed.labels[OWNER_LABEL] == request.owner_uid
        await provider.delete(provider_id)
