"""``rotate()`` of the client library and ``GET /v1/leases/{id}/rotation`` against a real
discovery replica. The reconciler's part is played by appending what it appends (docs/decisions/,
D85), so each outcome is reached at once and in order: a switch the held lease takes over, a
failure that leaves the lease as it was, and the ``switching`` moment between the promotion and
the lease's switch, which must not count as done. The whole product, Squids and all, is in
tests/integration/test_rotate_wait.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from egress_proxies_client import (
    AsyncClient,
    Client,
    EgressError,
    Lease,
    RotationFailed,
    UnknownLease,
)
from egress_proxies_client import _protocol as protocol
from events import subjects
from events.schemas import (
    LeaseSwitched,
    ReplacementPromoted,
    ReplacementStarted,
    RotationEnded,
    RotationRequested,
)
from events.store import NewEvent
from services.runtime.eventlog.jetstream import JetStreamEventStore
from tests.client.conftest import ATTRIBUTES
from tests.support.system import base_env, cli
from tests.support.waiting import until

pytestmark = pytest.mark.integration

NEW_URL = "http://127.0.0.1:3199"


async def asked(store: JetStreamEventStore, uid: str) -> str:
    """The id of the rotation discovery appended for the proxy, once it did."""

    async def found() -> str:
        history = await store.read(subjects.proxy(uid))
        ids = [
            r.event.rotation_id for r in history.events if isinstance(r.event, RotationRequested)
        ]
        return ids[-1] if ids else ""

    await until(found, what="the rotation request in the log")
    return await found()


async def started(store: JetStreamEventStore, uid: str, lease_id: str) -> str:
    rotation_id = await asked(store, uid)
    event = ReplacementStarted(
        rotation_id=rotation_id, command_id=f"c-{rotation_id}", lease_id=lease_id
    )
    await store.append(subjects.proxy(uid), [NewEvent(event, f"started-{rotation_id}")])
    return rotation_id


async def state(api: str, lease_id: str) -> str:
    async with httpx.AsyncClient(base_url=api) as http:
        answer = (await http.get(f"/v1/leases/{lease_id}/rotation")).json()
    return str(answer["state"])


async def switch(store: JetStreamEventStore, api: str, uid: str, lease_id: str) -> None:
    """Promote the replacement, check the rotation is only ``switching``, then switch the lease."""
    rotation_id = await started(store, uid, lease_id)
    promoted = ReplacementPromoted(
        rotation_id=rotation_id, provider_id="local-new", ip="127.0.0.1", url=NEW_URL
    )
    await store.append(subjects.proxy(uid), [NewEvent(promoted, f"promoted-{rotation_id}")])
    await until(lambda: _is(api, lease_id, "switching"), what="switching")
    switched = LeaseSwitched(
        lease_id=lease_id, proxy_uid=uid, rotation_id=rotation_id, provider_id="local-new"
    )
    await store.append(subjects.lease(uid), [NewEvent(switched, f"switched-{rotation_id}")])


async def _is(api: str, lease_id: str, expected: str) -> bool:
    return await state(api, lease_id) == expected


async def test_a_held_lease_takes_the_new_instance_once_the_lease_has_switched(
    api: str, jetstream_store: JetStreamEventStore
) -> None:
    async with AsyncClient(api) as client, client.lease(ATTRIBUTES, 60) as held:
        before = held.lease
        reconciler = asyncio.create_task(switch(jetstream_store, api, held.proxy.uid, held.id))
        rotation = await held.rotate(timeout=30)
        await reconciler
        assert rotation.state == "completed"
        assert held.url == rotation.lease.proxy.url == NEW_URL != before.proxy.url
        assert held.lease.fencing_token == rotation.lease.fencing_token > before.fencing_token
        assert held.lease.id == before.id
        # A renewal answered afterwards keeps the new instance.
        await held.renew()
        assert held.url == NEW_URL


async def fail(store: JetStreamEventStore, uid: str, lease_id: str) -> None:
    rotation_id = await started(store, uid, lease_id)
    ended = RotationEnded(rotation_id=rotation_id, message="the replacement never answered")
    await store.append(subjects.proxy(uid), [NewEvent(ended, f"ended-{rotation_id}")])


def rotate_and_fail(api: str, store: JetStreamEventStore, loop: asyncio.AbstractEventLoop) -> str:
    """The blocking client, on a thread of its own (the replica serves from the test's loop)."""
    with Client(api) as client, client.lease(ATTRIBUTES, 60) as held:
        before = held.lease
        reconciler = asyncio.run_coroutine_threadsafe(fail(store, held.proxy.uid, held.id), loop)
        with pytest.raises(RotationFailed, match="failed: the replacement never answered") as e:
            held.rotate(timeout=30)
        reconciler.result()
        assert e.value.rotation.state == e.value.code == "failed"
        assert held.lease == before
        assert client.get(held.id).fencing_token == before.fencing_token  # still held
        # The CLI waits for a new rotation (the failed one is over), which nobody plays here.
        waited = cli(
            "lease",
            "rotate",
            held.id,
            "--wait",
            "--timeout",
            "1s",
            "--api-url",
            api,
            env=base_env(),
        )
        assert waited.returncode == 11, waited.stdout + waited.stderr
        assert "still requested after 1s" in waited.stderr
        return held.id


async def test_a_failed_rotation_raises_and_leaves_the_lease_as_it_was(
    api: str, jetstream_store: JetStreamEventStore
) -> None:
    loop = asyncio.get_running_loop()
    lease_id = await asyncio.to_thread(rotate_and_fail, api, jetstream_store, loop)
    assert lease_id


async def test_the_rotation_of_a_lease_that_asked_for_none_and_of_no_lease(api: str) -> None:
    async with AsyncClient(api) as client, client.lease(ATTRIBUTES, 60) as held:
        with pytest.raises(EgressError) as none:
            await client.rotation(held.id)
        assert (none.value.status, none.value.code) == (404, "no_rotation")
        with pytest.raises(UnknownLease):
            await client.rotation("no-such-lease")
        with pytest.raises(UnknownLease):
            await client.rotate("no-such-lease")
        asked = await client.rotate(held.id, wait=False)
        assert (asked.state, asked.lease.id) == ("requested", held.id)
        with pytest.raises(TimeoutError, match=r"still requested after 0\.6s"):
            await client.rotate(held.id, timeout=0.6)  # nobody plays the reconciler
        assert (await client.rotation(held.id)).id == asked.id


def test_a_held_lease_never_goes_back_to_a_lower_fencing_token() -> None:
    """A renewal answered before the switch but read after the rotation's answer."""
    switched = Lease.from_json(_lease_json(url=NEW_URL, token=9))
    renewed_before = Lease.from_json(_lease_json(url="http://127.0.0.1:3128", token=4))
    assert protocol.newer(switched, renewed_before) is switched
    renewed_after = Lease.from_json(_lease_json(url=NEW_URL + "/x", token=9))
    assert protocol.newer(switched, renewed_after) is renewed_after  # new credentials, same token
    assert protocol.newer(None, renewed_before) is renewed_before


def _lease_json(url: str, token: int) -> dict[str, object]:
    return {
        "id": "l-1",
        "proxy": {"uid": "p", "url": url},
        "acquiredAt": "2026-12-01T10:00:00+00:00",
        "expiresAt": "2026-12-01T10:01:00+00:00",
        "fencingToken": token,
        "ttlSeconds": 60,
    }
