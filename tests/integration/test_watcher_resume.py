"""The watcher resumes: after a restart, after 410 Gone, and beside a duplicate of itself,
the log ends up with each change once."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.schemas import (
    CreateInstance,
    ProxyDeclared,
    ProxyDeletionRequested,
    ProxyRemoved,
    ProxySpecChanged,
)
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.watcher.pure.crdschema import FINALIZER
from services.watcher.service import WatcherService
from tests.support.kube import PROXIES
from tests.support.waiting import until
from tests.support.watcher_harness import NAMESPACE, Bench, bench

pytestmark = pytest.mark.integration


async def ready(b: Bench, *names: str) -> bool:
    return all(b.status(n).get("phase") == "Ready" and bool(b.status(n).get("ip")) for n in names)


def relists(service: WatcherService) -> int:
    return service.term.sync.relists if service.term is not None else 0


async def test_restart_catches_up_with_changes_made_while_down_without_duplicates(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        first = await b.watcher()
        kept = b.create("kept", placement={"zone": "a"})
        edited = b.create("edited", placement={"zone": "a"})
        deleted = b.create("deleted")
        forced = b.create("forced")
        await until(lambda: ready(b, "kept", "edited", "deleted", "forced"))
        await first.stop()

        # While no watcher runs: one new, one edited, one deleted (its finalizer holds it),
        # one deleted with its finalizer removed by hand (it is gone from the cluster at once).
        added = b.create("added")
        b.kube.patch(PROXIES, NAMESPACE, "edited", {"spec": {"placement": {"zone": "b"}}})
        b.kube.delete(PROXIES, NAMESPACE, "deleted")
        b.kube.patch(PROXIES, NAMESPACE, "forced", {"metadata": {"finalizers": []}})
        b.kube.delete(PROXIES, NAMESPACE, "forced")
        assert b.get("forced") is None

        await b.watcher()

        async def caught_up() -> bool:
            return (
                await ready(b, "kept", "edited", "added")
                and b.status("edited").get("observedGeneration") == 2
                and b.get("deleted") is None
                and await b.count(forced, ProxyRemoved) == 1
            )

        await until(caught_up, timeout=30)
        for uid in (kept, edited, deleted, forced, added):
            assert await b.count(uid, ProxyDeclared) == 1
        assert await b.count(kept, ProxySpecChanged) == 0
        assert await b.count(kept, CreateInstance) == 1
        assert await b.count(edited, ProxySpecChanged) == 1
        assert await b.count(deleted, ProxyDeletionRequested) == 1
        assert await b.count(forced, ProxyDeletionRequested) == 1
        assert set(b.fake.live_per_owner()) == {kept, edited, added}


async def test_410_gone_lists_again_and_appends_nothing_twice(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        replica = await b.watcher()
        uid = b.create("de-1")
        await until(lambda: ready(b, "de-1"))
        assert relists(replica.service) == 1

        # The apiserver forgets the history and drops the watch with 410 Gone: kubernetes_asyncio
        # retries once from the same (expired) resourceVersion, gets 410 again and gives up.
        b.kube.compact()
        b.kube.end_watches(gone=True)

        async def listed_again() -> bool:
            return relists(replica.service) >= 2

        await until(listed_again)
        later = b.create("de-2")
        await until(lambda: ready(b, "de-2"))
        assert await b.count(uid, ProxyDeclared) == 1
        assert await b.count(uid, CreateInstance) == 1
        assert await b.count(later, ProxyDeclared) == 1
        watches = b.kube.requests(lambda r: str(r.params.get("watch")).lower() == "true")
        assert watches
        assert all(str(r.params.get("allowWatchBookmarks")).lower() == "true" for r in watches)
        # Each watch after a listing resumes from the list's resourceVersion.
        assert all(r.params.get("resourceVersion") for r in watches if "proxies" in r.url.path)


async def test_bookmarks_move_the_resume_point(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        replica = await b.watcher()
        b.create("de-1")
        await until(lambda: ready(b, "de-1"))
        # Changes to other resources move the server's revision; only a bookmark tells the
        # watcher (it sees no Proxy event), so a resumed watch starts from there.
        b.kube.create("v1/configmaps", {"metadata": {"name": "other"}}, namespace="default")
        revision = b.kube.revision

        async def bookmarked() -> bool:
            term = replica.service.term
            return term is not None and int(term.sync.resource_version or 0) >= revision

        await until(bookmarked, timeout=10)


async def test_two_watchers_without_election_store_nothing_twice(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        await b.watcher()
        uids = [b.create(f"p{i}", placement={"zone": "a"}) for i in range(5)]
        await until(lambda: ready(b, *[f"p{i}" for i in range(5)]), timeout=30)
        b.kube.patch(PROXIES, NAMESPACE, "p0", {"spec": {"placement": {"zone": "b"}}})

        async def replaced() -> bool:
            return b.status("p0").get("observedGeneration") == 2 and await ready(b, "p0")

        await until(replaced, timeout=30)
        for uid in uids:
            assert await b.count(uid, ProxyDeclared) == 1
        assert await b.count(uids[0], ProxySpecChanged) == 1
        obj = b.get("p1")
        assert obj is not None
        assert obj["metadata"]["finalizers"] == [FINALIZER]
