"""Who holds a lease is an identity: two clients of one fleet on two discovery replicas and a
real nats-server. Each is refused on every route with the other's lease, a revoked token is
refused within a second on every replica, and the console's logins are per client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from events import subjects
from events.schemas import LeaseAcquired, LeaseReleased, LeaseRenewed, LeaseReported
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.pure.clients import hash_token
from tests.support.discovery import bearer_client, discovery, ready_proxy
from tests.support.waiting import until

pytestmark = pytest.mark.integration

TOKENS = {"crawler-a": "a" * 40, "crawler-b": "b" * 40, "ops": "o" * 40, "viewer": "v" * 40}
UIDS = ("p1", "p2", "p3", "p4")


def clients_yaml(names: tuple[str, ...] = tuple(TOKENS)) -> str:
    scopes = {"ops": "[admin]", "viewer": "[read]"}
    lines = ["clients:"]
    for name in names:
        lines += [
            f"  - name: {name}",
            f"    token: {hash_token(TOKENS[name])}",
            f"    scopes: {scopes.get(name, '[lease, read]')}",
        ]
        if name == "crawler-b":
            lines += ["    maxLeases: 2", "    selectors: [{country: de}]"]
    return "\n".join(lines) + "\n"


@dataclass
class Fleet:
    file: Path
    urls: tuple[str, str]

    def as_(self, name: str, replica: int = 0) -> httpx.AsyncClient:
        return bearer_client(self.urls[replica], TOKENS[name])


@pytest.fixture
async def fleet(
    nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore, tmp_path: Path
) -> AsyncIterator[Fleet]:
    for uid in UIDS:
        await ready_proxy(jetstream_store, uid, {"country": "de" if uid != "p4" else "fr"})
    file = tmp_path / "clients.yaml"
    file.write_text(clients_yaml())
    async with (
        discovery(nats_server.url, clients_file=file) as (_, first),
        discovery(nats_server.url, clients_file=file) as (_, second),
    ):
        yield Fleet(file, (first, second))


def _routes(lease_id: str) -> list[tuple[str, str, dict[str, object] | None]]:
    base = f"/v1/leases/{lease_id}"
    return [
        ("GET", base, None),
        ("PATCH", base, {"ttlSeconds": 60}),
        ("POST", f"{base}/report", {"outcome": "blocked", "target": "example.com"}),
        ("POST", f"{base}/rotate", None),
        ("GET", f"{base}/rotation", None),
        ("DELETE", base, None),
    ]


async def test_a_client_is_refused_on_every_route_with_another_clients_lease(
    fleet: Fleet, jetstream_store: JetStreamEventStore
) -> None:
    async with fleet.as_("crawler-a", 0) as a, fleet.as_("crawler-b", 1) as b:
        got = await a.post("/v1/leases", json={"selector": {}, "holder": "shared-name"})
        assert got.status_code == 201, got.text
        lease = got.json()

        async def b_sees_it() -> bool:
            return (await b.get(f"/v1/leases/{lease['id']}")).status_code == 403

        await until(b_sees_it, what="the other replica to know the lease")
        for method, path, body in _routes(lease["id"]):
            refused = await b.request(method, path, json=body)
            assert refused.status_code == 403, (method, path, refused.text)
            assert refused.json()["error"] == "not_your_lease"
            assert "crawler-a" not in refused.text  # the owner is not named to a stranger
            assert lease["proxy"]["url"] not in refused.text
        # The same holder label lists and releases only the caller's own leases.
        listed = await b.get("/v1/leases", params={"holder": "shared-name"})
        assert listed.json()["items"] == []
        assert listed.json()["total"] == 0  # not even counted
        paged = await b.get("/v1/leases", params={"holder": "shared-name", "limit": "1"})
        assert (paged.json()["items"], paged.json()["total"], paged.json()["continue"]) == (
            [],
            0,
            "",
        )
        own = (await a.get("/v1/leases", params={"holder": "shared-name", "limit": "1"})).json()
        assert ([x["id"] for x in own["items"]], own["total"]) == ([lease["id"]], 1)
        released = await b.delete("/v1/leases", params={"holder": "shared-name"})
        assert released.json() == {"released": 0}
        # The same Idempotency-Key from another client is another request, not a way in.
        key = {"Idempotency-Key": "same-key"}
        mine = await a.post("/v1/leases", json={"selector": {"country": "de"}}, headers=key)
        theirs = await b.post("/v1/leases", json={"selector": {"country": "de"}}, headers=key)
        assert mine.status_code == theirs.status_code == 201
        assert mine.json()["id"] != theirs.json()["id"]
        assert mine.json()["proxy"]["uid"] != theirs.json()["proxy"]["uid"]

        # Nothing of crawler-a's was touched, and the owner still does everything.
        for method, path, body in _routes(lease["id"]):
            if path.endswith("/rotate"):
                continue  # a rotation of a proxy never made by a provider would not end
            answer = await a.request(method, path, json=body)
            expected = "no_rotation" if path.endswith("/rotation") else None
            assert answer.status_code < 400 or answer.json()["error"] == expected, answer.text

    history = await jetstream_store.read(subjects.lease(lease["proxy"]["uid"]))
    mine_events = [
        r.event
        for r in history.events
        if isinstance(r.event, LeaseAcquired | LeaseRenewed | LeaseReported | LeaseReleased)
        and r.event.lease_id == lease["id"]
    ]
    assert [type(e).__name__ for e in mine_events] == [
        "LeaseAcquired",
        "LeaseRenewed",
        "LeaseReported",
        "LeaseReleased",
    ]
    assert {e.client for e in mine_events} == {"crawler-a"}  # the log names the client


async def test_an_admin_may_act_on_any_lease_and_a_reader_on_none(fleet: Fleet) -> None:
    async with (
        fleet.as_("crawler-a", 0) as a,
        fleet.as_("ops", 1) as ops,
        fleet.as_("viewer", 1) as viewer,
    ):
        lease = (await a.post("/v1/leases", json={"holder": "h"})).json()

        async def ops_sees_it() -> bool:
            return (await ops.get(f"/v1/leases/{lease['id']}")).status_code == 200

        await until(ops_sees_it, what="the admin to see the lease on the other replica")
        assert [x["id"] for x in (await ops.get("/v1/leases?holder=h")).json()["items"]] == [
            lease["id"]
        ]
        assert (await viewer.get("/v1/proxies")).status_code == 200
        for method, path, body in [("POST", "/v1/leases", {}), *_routes(lease["id"])]:
            refused = await viewer.request(method, path, json=body)
            assert refused.status_code == 403, (method, path)
            assert "'lease' scope" in refused.json()["message"]
        assert (await ops.delete(f"/v1/leases/{lease['id']}")).status_code == 204


async def test_a_clients_limits_are_enforced_with_the_limit_named(fleet: Fleet) -> None:
    async with fleet.as_("crawler-b", 0) as b:
        fr = await b.post("/v1/leases", json={"selector": {"country": "fr"}})
        assert fr.status_code == 403
        assert "{'country': 'de'}" in fr.json()["message"]
        assert (await b.post("/v1/leases", json={"selector": {}})).status_code == 403
        for _ in range(2):
            assert (
                await b.post("/v1/leases", json={"selector": {"country": "de"}})
            ).status_code == 201
        over = await b.post("/v1/leases", json={"selector": {"country": "de"}})
        assert over.status_code == 429
        assert over.json()["error"] == "lease_limit"
        assert "maxLeases 2" in over.json()["message"]


async def test_a_revoked_token_is_refused_within_a_second_on_every_replica(fleet: Fleet) -> None:
    clients = [fleet.as_("crawler-a", r) for r in (0, 1)]
    try:
        for client in clients:
            assert (await client.get("/v1/proxies")).status_code == 200
        fleet.file.write_text(clients_yaml(("crawler-b", "ops", "viewer")))
        revoked = time.monotonic()
        refused_after = []
        for client in clients:

            async def refused(c: httpx.AsyncClient = client) -> bool:
                return (await c.get("/v1/proxies")).status_code == 401

            await until(refused, timeout=5, every=0.05, what="the revoked token refused")
            refused_after.append(time.monotonic() - revoked)
        assert max(refused_after) < 1.0, refused_after
        # A file that no longer parses keeps the clients in force; a mended one is taken.
        fleet.file.write_text("clients: [oops")

        for client in clients:  # each replica has read the broken file (its error counted)

            async def broken_read(c: httpx.AsyncClient = client) -> bool:
                name = "egress_api_clients_file_errors_total "
                lines = (await c.get("/metrics")).text.splitlines()
                return any(float(x[len(name) :]) >= 1 for x in lines if x.startswith(name))

            await until(broken_read, timeout=5, what="the broken file read")
        async with fleet.as_("crawler-b", 1) as b:
            assert (await b.get("/v1/proxies")).status_code == 200
        fleet.file.write_text(clients_yaml())
        for client in clients:

            async def back(c: httpx.AsyncClient = client) -> bool:
                return (await c.get("/v1/proxies")).status_code == 200

            await until(back, timeout=5, what="the client back")
    finally:
        for client in clients:
            await client.aclose()


def _origin(url: str) -> dict[str, str]:
    return {"Origin": url}


async def test_console_sessions_are_per_client_and_end_on_logout_everywhere(fleet: Fleet) -> None:
    first, second = fleet.urls
    async with (
        httpx.AsyncClient(base_url=first, timeout=10) as one,
        httpx.AsyncClient(base_url=second, timeout=10) as two,
    ):
        crawler = await one.post(
            "/ui/login", data={"token": TOKENS["crawler-a"], "next": "/ui"}, headers=_origin(first)
        )
        assert crawler.status_code == 303
        cookie = one.cookies.get("egress_console")
        assert cookie
        assert TOKENS["crawler-a"] not in cookie
        assert (await one.get("/ui")).status_code == 200
        # The same session on the other replica.
        two.cookies.set("egress_console", cookie, path="/ui")
        assert (await two.get("/ui")).status_code == 200
        # A login from another site is refused, with or without a good token.
        forged = await two.post(
            "/ui/login",
            data={"token": TOKENS["crawler-a"]},
            headers={"Origin": "https://evil.example"},
        )
        assert forged.status_code == 403
        forged_out = await two.post("/ui/logout", headers={"Sec-Fetch-Site": "cross-site"})
        assert forged_out.status_code == 403
        assert (await two.get("/ui")).status_code == 200  # still signed in
        # Logging out on one replica ends the client's sessions on the other too.
        out = await one.post("/ui/logout", headers=_origin(first))
        assert out.status_code == 303

        async def ended() -> bool:
            return (await two.get("/ui")).status_code == 303

        await until(ended, timeout=5, what="the session ended on the other replica")
        # A changed token (the client's entry replaced) ends a session at once.
        again = await one.post(
            "/ui/login", data={"token": TOKENS["crawler-a"]}, headers=_origin(first)
        )
        assert again.status_code == 303
        assert (await one.get("/ui")).status_code == 200
        fleet.file.write_text(
            clients_yaml().replace(hash_token(TOKENS["crawler-a"]), hash_token("n" * 40))
        )

        async def logged_out() -> bool:
            return (await one.get("/ui")).status_code == 303

        await until(logged_out, timeout=5, what="the session of a changed token ended")


async def test_console_login_brute_force_is_slowed_per_address(fleet: Fleet) -> None:
    first = fleet.urls[0]
    async with httpx.AsyncClient(base_url=first, timeout=10) as ui:
        answers = []
        for attempt in range(8):
            got = await ui.post(
                "/ui/login", data={"token": f"guess-{attempt}"}, headers=_origin(first)
            )
            answers.append(got.status_code)
        assert answers == [401] * 5 + [429] * 3
        throttled = await ui.post(
            "/ui/login", data={"token": "guess-again"}, headers=_origin(first)
        )
        assert 1 <= int(throttled.headers["retry-after"]) <= 13
        # The right token is never locked out by others' guesses (D135).
        right = await ui.post("/ui/login", data={"token": TOKENS["ops"]}, headers=_origin(first))
        assert right.status_code == 303
