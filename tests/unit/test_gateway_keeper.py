"""The gateway's leases against a scripted discovery API (httpx's MockTransport, no server):
a rotating lease let go after ``--rotating-idle`` and a request that needs one at that moment
(docs/decisions/0157-the-gateway-in-up-and-real-clients-through-it.md)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx

from services.gateway.api import Api
from services.gateway.leases import Caller, Keeper
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
