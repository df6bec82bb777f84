"""Declaring proxies from YAML, on the in-memory store."""

from __future__ import annotations

import pytest

from commands.declaring import apply, delete
from events import subjects
from events.customresource import ResourceError, cli_uid
from events.schemas import ProxyDeclared, ProxyRemoved, ProxySpecChanged
from events.store import NewEvent
from services.cli.fleet.manifests import parse_resources
from services.runtime.eventlog.memory import InMemoryEventStore

DOC = """
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: de-1, namespace: crawl}
spec:
  provider: local
  attributes: {country: de}
  healthCheck: {intervalSeconds: 2}
"""


async def test_apply_is_idempotent_and_tracks_generations() -> None:
    store = InMemoryEventStore()
    [resource] = parse_resources(DOC, "proxies.yaml")
    first = await apply(store, resource)
    assert first.result == "created"
    assert first.uid == cli_uid("crawl", "de-1")
    assert (await apply(store, resource)).result == "unchanged"
    [changed] = parse_resources(DOC.replace("country: de", "country: fr"), "proxies.yaml")
    assert (await apply(store, changed)).result == "changed"
    events = [r.event for r in (await store.read(subjects.proxy(first.uid))).events]
    assert isinstance(events[0], ProxyDeclared)
    assert events[0].spec.health_check.interval_seconds == 2
    assert isinstance(events[1], ProxySpecChanged)
    assert events[1].generation == 2
    assert len(events) == 2


async def test_delete_then_reapply_after_removal() -> None:
    store = InMemoryEventStore()
    [resource] = parse_resources(DOC, "p.yaml")
    applied = await apply(store, resource)
    assert (await delete(store, "crawl", "de-1")).result == "deleted"
    assert (await delete(store, "crawl", "de-1")).result == "deleting"
    assert (await apply(store, resource)).result == "deleting"
    await store.append(subjects.proxy(applied.uid), [NewEvent(ProxyRemoved(uid=applied.uid), "rm")])
    again = await apply(store, resource)
    assert again.result == "created"
    assert again.uid == applied.uid
    assert (await delete(store, "crawl", "nope")).result == "absent"


def test_many_documents() -> None:
    text = DOC + "\n---\n" + DOC.replace("de-1", "de-2")
    assert [r.metadata.name for r in parse_resources(text, "f")] == ["de-1", "de-2"]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("provider: local", "provider: ''"), "spec.provider"),
        (("intervalSeconds: 2", "intervalSeconds: -1"), "spec.healthCheck.intervalSeconds"),
        (("intervalSeconds: 2", "intervalSeconds: soon"), "$.spec.healthCheck.intervalSeconds"),
        (("name: de-1", "name: De_1"), "metadata.name"),
        (("kind: Proxy", "kind: Pod"), "kind"),
        (("provider: local", "provider: local\n  cloudInit: {secretRef: {name: s}}"), "secretRef"),
    ],
)
def test_invalid_documents_name_the_field(edit: tuple[str, str], field: str) -> None:
    with pytest.raises(ResourceError) as info:
        parse_resources(DOC.replace(*edit), "bad.yaml")
    assert field in str(info.value)
    assert "bad.yaml" in str(info.value)


def test_one_bad_document_refuses_the_whole_file() -> None:
    text = DOC + "\n---\n" + DOC.replace("de-1", "BAD")
    with pytest.raises(ResourceError, match="document 2"):
        parse_resources(text, "f")


def test_not_yaml() -> None:
    with pytest.raises(ResourceError, match="not valid YAML"):
        parse_resources("a: [", "f")
