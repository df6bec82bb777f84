"""The gateway's leases against a scripted discovery API (httpx's MockTransport, no server):
a rotating lease let go after ``--rotating-idle`` and a request that needs one at that moment
(docs/decisions/0157-the-gateway-in-up-and-real-clients-through-it.md)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx

from services.gateway.api import Api
from services.gateway.leases import MAX_BACKGROUND, Caller, Held, Keeper
from services.gateway.pure.username import Ask


class OneProxy:
    """An API with one proxy: a lease of it is refused 503 while another is active, as the
    real API refuses a proxy still leased. A release is answered once ``released`` is set."""

    def __init__(self) -> None:
        self.active = ""
        self.granted = 0
        self.refused = 0
        self.released = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/leases":
            if self.active:
                self.refused += 1
                return httpx.Response(503, json={"error": "unavailable", "message": "1 leased"})
            self.granted += 1
            self.active = f"lease-{self.granted}"
            expires = datetime.now(UTC) + timedelta(seconds=60)
            return httpx.Response(
                201,
                json={
                    "id": self.active,
                    "ttlSeconds": 60,
                    "expiresAt": expires.isoformat(),
                    "proxy": {
                        "uid": "px-1",
                        "namespace": "crawl",
                        "name": "de-1",
                        "url": f"http://{self.active}:secret@127.0.0.1:3128",
                    },
                },
            )
        if request.method == "DELETE":
            await self.released.wait()
            self.active = ""
            return httpx.Response(204)
        return httpx.Response(404, json={"error": "not_found", "message": request.url.path})


async def test_a_request_while_its_idle_lease_is_released_waits_for_the_release() -> None:
    fake = OneProxy()
    now = [1000.0]
    api = Api("http://api.test", transport=httpx.MockTransport(fake.handle))
    keeper = Keeper(api, idle=30.0, clock=lambda: now[0])
    caller = Caller("crawler-a", "token")
    first = await keeper.lease(caller, Ask())
    now[0] += 31.0  # unused past --rotating-idle
    await keeper.sweep()
    assert first.gone
    asking = asyncio.create_task(keeper.lease(caller, Ask()))
    for _ in range(20):  # every step the request can take without the release answered
        await asyncio.sleep(0)
    # It waits for the release rather than asking for the proxy while it is still leased.
    assert not asking.done()
    assert fake.refused == 0
    fake.released.set()
    second = await asking
    assert (second.lease_id, fake.refused) == ("lease-2", 0)
    await keeper.close()
    await api.aclose()


class SlowRenewal(OneProxy):
    """``OneProxy`` whose renewals wait for ``answer`` and are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0
        self.answer = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method != "PATCH":
            return await super().handle(request)
        self.renewals += 1
        await self.answer.wait()
        expires = datetime.now(UTC) + timedelta(seconds=60)
        return httpx.Response(
            200,
            json={
                "id": self.active,
                "ttlSeconds": 60,
                "expiresAt": expires.isoformat(),
                "proxy": {
                    "uid": "px-1",
                    "namespace": "crawl",
                    "name": "de-1",
                    "url": f"http://{self.active}:secret@127.0.0.1:3128",
                },
            },
        )


async def test_requests_while_a_renewal_is_under_way_start_no_other() -> None:
    fake = SlowRenewal()
    now = [1000.0]
    api = Api("http://api.test", transport=httpx.MockTransport(fake.handle))
    keeper = Keeper(api, clock=lambda: now[0])
    caller = Caller("crawler-a", "token")
    held = await keeper.lease(caller, Ask())
    held.expires = now[0] + 20.0  # less than half the 60 s left: due for renewal
    for _ in range(50):  # a busy crawler's requests while the API has not answered
        assert await keeper.lease(caller, Ask()) is held
        await asyncio.sleep(0)
    assert fake.renewals == 1
    fake.answer.set()
    await asyncio.gather(*keeper._tasks)  # the renewal, answered
    assert held.expires > now[0] + 50.0  # the renewal's answer is the lease's new end
    held.expires = now[0] + 20.0  # due again: the next request renews again
    await keeper.lease(caller, Ask())
    await asyncio.gather(*keeper._tasks)  # the renewal, answered
    assert fake.renewals == 2
    fake.released.set()
    await keeper.close()
    await api.aclose()


async def test_a_renewal_dropped_when_too_much_is_under_way_is_asked_again() -> None:
    fake = SlowRenewal()
    fake.answer.set()
    now = [1000.0]
    api = Api("http://api.test", transport=httpx.MockTransport(fake.handle))
    keeper = Keeper(api, clock=lambda: now[0])
    caller = Caller("crawler-a", "token")
    held = await keeper.lease(caller, Ask())
    held.expires = now[0] + 20.0
    blockers = {asyncio.create_task(asyncio.sleep(3600)) for _ in range(MAX_BACKGROUND)}
    keeper._tasks |= blockers  # the background is full
    await keeper.lease(caller, Ask())
    assert (fake.renewals, held.renewing, keeper.dropped) == (0, False, 1)
    keeper._tasks -= blockers
    for task in blockers:
        task.cancel()
    await keeper.lease(caller, Ask())
    await asyncio.gather(*keeper._tasks)  # the renewal, answered
    assert fake.renewals == 1
    fake.released.set()
    await keeper.close()
    await api.aclose()


async def test_a_rotating_request_never_takes_an_ended_or_ending_lease() -> None:
    fake = OneProxy()  # holds one lease: a new one is refused while it is active
    now = [1000.0]
    api = Api("http://api.test", transport=httpx.MockTransport(fake.handle))
    keeper = Keeper(api, rotating=3, clock=lambda: now[0])
    caller = Caller("crawler-a", "token")
    first = await keeper.lease(caller, Ask())
    ring = keeper.rings[("crawler-a", Ask().key())]
    ended = Held(first.granted, caller, 60.0, expires=now[0] + 60.0, checked=now[0], gone=True)
    ending = Held(first.granted, caller, 60.0, expires=now[0] + 0.5, checked=now[0])
    ring.held += [ended, ending]
    ring.full_until = now[0] + 3600.0  # no room: the request picks among what the ring holds
    for _ in range(6):
        assert await keeper.lease(caller, Ask()) is first
    assert ring.held == [first]
    fake.released.set()
    await keeper.close()
    await api.aclose()
