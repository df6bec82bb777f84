"""Events a rotation cannot use, published straight to its subjects, wedge nothing: the
reconciler dead-letters what does not decode, the folds skip what is about no rotation they
know, and the next real rotation completes (docs/architecture.md, "What the log accepts, and
what survives a bad event"; docs/decisions/0085-a-fresh-ip-without-downtime.md)."""

from __future__ import annotations

import json

import pytest

from events import codec, subjects
from events.schemas import DeadLettered, Event, LeaseSwitched, ReplacementPromoted, RotationEnded
from projections import lease
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.testing.provider import FakeProvider
from tests.support.lifecycle import fleet, view
from tests.support.natsclient import client
from tests.support.rotation import (
    declared,
    judge_healthy,
    leased,
    replacement_running,
    request_rotation,
    serving,
    token,
)
from tests.support.waiting import until

pytestmark = pytest.mark.reliability


async def test_poison_on_the_rotation_subjects_leaves_rotations_working(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    store = jetstream_store
    fake = FakeProvider()
    async with fleet(nats_server.url, {"fake": fake}):
        uid = await declared(store, "fake")
        before = await serving(store, uid)
        first = await leased(store, uid)
        stray: dict[str, list[Event]] = {
            f"proxy.{uid}.status": [
                ReplacementPromoted(rotation_id="nobody", provider_id="px-nobody"),
                RotationEnded(rotation_id="nobody"),
            ],
            f"lease.{uid}": [
                LeaseSwitched(
                    lease_id="someone-else", proxy_uid=uid, rotation_id="nobody", provider_id="x"
                ),
            ],
        }
        # Decodes, but no fold can use it: the codec would refuse to write it.
        empty = {"type": "LeaseSwitched", "lease_id": "lease-1", "proxy_uid": uid}
        empty |= {"rotation_id": "nobody", "provider_id": ""}
        async with client(nats_server.admin_url) as admin:
            js = admin.nc.jetstream()
            rotate = f"proxy.{uid}.rotate"
            named = {"Egress-Event-Type": "RotationRequested"}
            await js.publish(rotate, b"{not json", headers=named)
            bad = {"type": "RotationRequested", "uid": 7, "rotation_id": None}
            await js.publish(rotate, json.dumps(bad).encode())
            await js.publish(rotate, b"", headers=named)
            for subject, events in stray.items():
                for event in events:
                    headers = codec.envelope_headers(event, f"stray-{type(event).__name__}")
                    await js.publish(subject, codec.encode(event), headers=headers)
            await js.publish(f"lease.{uid}", json.dumps(empty).encode())
        assert await token(store, uid) == first
        after_stray = await view(store, uid)
        assert after_stray is not None
        assert (after_stray.provider_id, after_stray.url) == (before.provider_id, before.url)
        assert after_stray.replacement is None

        await request_rotation(store, uid)
        new = await replacement_running(store, uid)
        await judge_healthy(store, uid, new)

        async def converged() -> bool:
            now = await view(store, uid)
            return now is not None and now.provider_id == new and fake.live_per_owner()[uid] == 1

        await until(converged, timeout=60)
    assert await token(store, uid) > first
    switched = lease.fold(list((await store.read(subjects.lease(uid))).events))
    assert switched is not None
    assert switched.current is not None
    assert (switched.current.rotation_id, switched.current.provider_id) == ("rot-1", new)
    assert switched.unusable == 1
    letters = (await store.read(subjects.deadletter("reconciler"))).events
    rotate_letters = [
        r.event
        for r in letters
        if isinstance(r.event, DeadLettered) and r.event.subject == f"proxy.{uid}.rotate"
    ]
    assert len(rotate_letters) == 3
