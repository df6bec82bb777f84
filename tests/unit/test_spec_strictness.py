"""Every number of a Proxy's and a ProxyPool's spec is a number, on the CLI's path (``apply
-f``) and the watcher's (the CRDs): a string such as ``replicas: "3"`` is refused naming the
field and the fix, where it was coerced before (docs/decisions/0137-a-pool-member-is-the-pools.md).
The same values as numbers are accepted, so the refusal is of the quotes alone."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from events import poolresource, proxyresource
from events.customresource import ResourceError
from services.cli.main import main
from services.watcher.pure.objects import Problem, parse_proxy
from services.watcher.pure.pools import parse_pool

PROXY: dict[str, Any] = {
    "apiVersion": "crawl.example.com/v1alpha1",
    "kind": "Proxy",
    "metadata": {"name": "de-1", "namespace": "crawl"},
    "spec": {
        "provider": "local",
        "healthCheck": {
            "intervalSeconds": 2,
            "timeoutSeconds": 1.5,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "egress": {"expect": {"asn": [3320]}},
    },
}
POOL: dict[str, Any] = {
    "apiVersion": "crawl.example.com/v1alpha1",
    "kind": "ProxyPool",
    "metadata": {"name": "de", "namespace": "crawl"},
    "spec": {
        "replicas": 3,
        "recycleOnBlocks": 2,
        "maxSurge": 1,
        "spread": [{"provider": "local", "weight": 2}],
        "autoscale": {"min": 1, "max": 4, "targetLeased": 0.8},
        "template": {"healthCheck": {"failureThreshold": 3, "intervalSeconds": 2}},
    },
}
PROXY_NUMBERS = [
    ("spec", "healthCheck", "intervalSeconds"),
    ("spec", "healthCheck", "timeoutSeconds"),
    ("spec", "healthCheck", "failureThreshold"),
    ("spec", "healthCheck", "successThreshold"),
    ("spec", "egress", "expect", "asn", 0),
]
POOL_NUMBERS = [
    ("spec", "replicas"),
    ("spec", "recycleOnBlocks"),
    ("spec", "maxSurge"),
    ("spec", "spread", 0, "weight"),
    ("spec", "autoscale", "min"),
    ("spec", "autoscale", "max"),
    ("spec", "autoscale", "targetLeased"),
    ("spec", "template", "healthCheck", "failureThreshold"),
    ("spec", "template", "healthCheck", "intervalSeconds"),
]


def quoted(document: dict[str, Any], path: tuple[str | int, ...]) -> dict[str, Any]:
    """``document`` with the number at ``path`` written as a string."""
    changed = copy.deepcopy(document)
    target: Any = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = str(target[path[-1]])
    return changed


def shown(path: tuple[str | int, ...]) -> str:
    return "$." + ".".join(str(k) for k in path).replace(".0", "[0]")


def test_the_numbers_as_numbers_are_accepted() -> None:
    proxyresource.from_object(PROXY)
    poolresource.from_object(POOL)
    assert parse_proxy(PROXY).invalid is None
    assert parse_pool(POOL).problem is None


def refused_on_both_paths(
    document: dict[str, Any],
    from_object: Callable[[dict[str, Any]], object],
    watcher: Callable[[dict[str, Any]], Problem | None],
    path: tuple[str | int, ...],
) -> str:
    """``document`` with the number at ``path`` quoted: the CLI's path refuses it naming the
    field and the fix, and the watcher refuses it too; the watcher's message."""
    document = quoted(document, path)
    with pytest.raises(ResourceError) as refused:
        from_object(document)
    assert shown(path) in str(refused.value)
    assert 'without quotes: 3, not "3"' in str(refused.value)
    problem = watcher(document)
    assert problem is not None, "the watcher refuses it too"
    return problem.message


@pytest.mark.parametrize("path", PROXY_NUMBERS, ids=str)
def test_a_proxys_quoted_number_is_refused_naming_the_field(path: tuple[str | int, ...]) -> None:
    message = refused_on_both_paths(
        PROXY, proxyresource.from_object, lambda d: parse_proxy(d).invalid, path
    )
    assert ".".join(str(k) for k in path[1:]).replace(".0", "[0]") in message


@pytest.mark.parametrize("path", POOL_NUMBERS, ids=str)
def test_a_pools_quoted_number_is_refused_naming_the_field(path: tuple[str | int, ...]) -> None:
    message = refused_on_both_paths(
        POOL, poolresource.from_object, lambda d: parse_pool(d).problem, path
    )
    assert shown(path) in message


def test_apply_refuses_a_quoted_replicas_before_it_connects(tmp_path: Path) -> None:
    manifest = tmp_path / "pool.yaml"
    manifest.write_text(
        "apiVersion: crawl.example.com/v1alpha1\nkind: ProxyPool\n"
        'metadata: {name: de, namespace: crawl}\nspec:\n  replicas: "3"\n'
        "  template: {provider: local}\n"
    )
    result = CliRunner().invoke(
        main, ["apply", "-f", str(manifest), "--nats-url", "nats://127.0.0.1:1"]
    )
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "$.spec.replicas" in said, said
    assert "Expected `int`, got `str`" in said
