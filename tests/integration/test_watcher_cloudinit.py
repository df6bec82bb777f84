"""Cloud-init from labelled Secrets, and Proxies the watcher cannot act on."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from events.schemas import CreateInstance, ProxyDeclared, ProxySpecChanged
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.server import EmbeddedNatsServer
from services.watcher.pure.proxycrd import CLOUD_INIT_LABEL
from tests.support.kube import SECRETS
from tests.support.waiting import until
from tests.support.watcher_harness import NAMESPACE, Bench, bench

pytestmark = pytest.mark.integration

SECRET_REF = {"secretRef": {"name": "boot"}}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(content: str, *, labelled: bool) -> dict[str, object]:
    labels = {CLOUD_INIT_LABEL: "true"} if labelled else {"app": "other"}
    return {"metadata": {"name": "boot", "labels": labels}, "data": {"userdata": b64(content)}}


async def ready(b: Bench, name: str) -> bool:
    status = b.status(name)
    return status.get("phase") == "Ready" and bool(status.get("ip"))


async def creates(b: Bench, uid: str) -> list[CreateInstance]:
    return [e for e in await b.events(uid) if isinstance(e, CreateInstance)]


async def test_unlabelled_secret_is_a_cloud_init_error_until_labelled(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        b.kube.create(SECRETS, secret("#cloud-config\n", labelled=False), namespace=NAMESPACE)
        uid = b.create("de-1", cloudInit=SECRET_REF)

        async def refused() -> bool:
            return b.condition("de-1", "CloudInitError").get("status") == "True"

        await until(refused)
        cond = b.condition("de-1", "CloudInitError")
        assert cond["reason"] == "SecretNotLabelled"
        assert CLOUD_INIT_LABEL in cond["message"]
        assert b.status("de-1")["phase"] == "Failed"
        assert b.condition("de-1", "Ready")["status"] == "False"
        assert await b.events(uid) == []  # nothing declared: no instance
        assert b.fake.created_total == 0
        # The Kubernetes Event is written after the status patch, by its own request.
        await until(
            lambda: any(e["reason"] == "SecretNotLabelled" for e in b.kube_events("de-1")),
            what="a SecretNotLabelled Event on the Proxy",
        )

        # Labelling the Secret is consent: the proxy is declared with its content.
        b.kube.patch(
            SECRETS, NAMESPACE, "boot", {"metadata": {"labels": {CLOUD_INIT_LABEL: "true"}}}
        )
        await until(lambda: ready(b, "de-1"))
        assert b.condition("de-1", "CloudInitError")["status"] == "False"
        [declared] = [e for e in await b.events(uid) if isinstance(e, ProxyDeclared)]
        assert declared.cloud_init_resolved == "#cloud-config\n"
        [create] = await creates(b, uid)
        assert create.cloud_init == "#cloud-config\n"


async def test_missing_secret_is_a_cloud_init_error(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        uid = b.create("de-1", cloudInit=SECRET_REF)

        async def refused() -> bool:
            return b.condition("de-1", "CloudInitError").get("reason") == "SecretNotFound"

        await until(refused)
        assert await b.events(uid) == []


async def test_secret_rotation_replaces_the_instance(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        b.kube.create(SECRETS, secret("#cloud-config\n# v1\n", labelled=True), namespace=NAMESPACE)
        uid = b.create("de-1", cloudInit=SECRET_REF)
        await until(lambda: ready(b, "de-1"))
        before = b.status("de-1")["ip"]
        b.kube.patch(
            SECRETS, NAMESPACE, "boot", {"data": {"userdata": b64("#cloud-config\n# v2\n")}}
        )

        async def replaced() -> bool:
            return len(await creates(b, uid)) == 2 and await ready(b, "de-1")

        await until(replaced, timeout=30)
        first, second = await creates(b, uid)
        assert first.spec_hash != second.spec_hash
        assert second.cloud_init == "#cloud-config\n# v2\n"
        assert b.status("de-1")["ip"] != before
        assert await b.count(uid, ProxySpecChanged) == 1
        assert b.fake.live_per_owner() == {uid: 1}


async def test_invalid_proxies_are_failed_with_the_reason(
    tmp_path: Path, nats_server: EmbeddedNatsServer, jetstream_store: JetStreamEventStore
) -> None:
    async with bench(tmp_path, nats_server.url, jetstream_store) as b:
        await b.watcher()
        # A spec that does not even convert never reaches the log.
        garbled = b.create("garbled", healthCheck={"intervalSeconds": "often"})
        # One that converts but breaks a rule is declared; the reconciler latches it Failed
        # (the same path the CLI's declarations take).
        b.create("no-provider", provider="")

        async def failed() -> bool:
            return (
                b.status("garbled").get("phase") == "Failed"
                and b.status("no-provider").get("phase") == "Failed"
            )

        await until(failed)
        assert b.condition("garbled", "InvalidSpec")["status"] == "True"
        assert "healthCheck.intervalSeconds" in b.condition("garbled", "InvalidSpec")["message"]
        assert await b.events(garbled) == []
        assert b.status("no-provider")["reason"] == "InvalidSpec"
        assert "spec.provider" in b.status("no-provider")["message"]
        assert b.condition("no-provider", "InvalidSpec")["status"] == "True"
        assert b.condition("no-provider", "Ready")["reason"] == "InvalidSpec"
        assert b.fake.created_total == 0
