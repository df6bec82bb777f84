"""ProxyPool documents through the CLI's path (``apply -f``, ``delete -f``, ``get -l``): a pool is
refused before anything is appended, each problem named by document and field, and one bad
document refuses every document of every file, Proxies and pools alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from commands.declaring import uid_of
from events.customresource import ResourceError
from events.pool import MAX_REPLICAS
from events.poolresource import pool_uid
from events.proxyresource import ProxyResource
from services.cli.fleet import manifests
from services.cli.fleet.manifests import PoolDocument, parse_documents
from services.cli.main import main
from services.cli.pure.selector import matches, parse_selector

POOL = """\
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: de, namespace: crawl}
spec:
  replicas: 3
  maxAge: 6h
  template:
    attributes: {country: de}
  spread:
    - {provider: local, weight: 2}
    - {provider: gcp}
"""
PROXY = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: de-1, namespace: crawl}
spec: {provider: local}
"""


def apply(tmp_path: Path, text: str, *flags: str) -> Result:
    """``apply -f`` up to where it would connect: a refused file never gets that far (an
    unused port stands in for the server, so an accepted one fails to connect, exit 3)."""
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    args = ["apply", "-f", str(path), *flags, "--nats-url", "nats://127.0.0.1:1"]
    return CliRunner().invoke(main, args, env={"NATS_URL": None, "OTEL_SDK_DISABLED": "true"})


def refusal(text: str) -> str:
    with pytest.raises(ResourceError) as refused:
        parse_documents(text, "pools.yaml")
    return str(refused.value)


def test_a_mixed_file_gives_its_proxies_and_pools_in_its_order() -> None:
    documents = parse_documents(PROXY + "---\n" + POOL, "pools.yaml")
    assert [type(d) for d in documents] == [ProxyResource, PoolDocument]
    pool = documents[1]
    assert isinstance(pool, PoolDocument)
    assert (pool.namespace, pool.name, pool.uid) == ("crawl", "de", pool_uid("crawl", "de"))
    assert pool.spec.max_age_seconds == 6 * 3600
    assert [e.provider for e in pool.spec.spread] == ["local", "gcp"]
    # The Proxies alone, for callers that declare only Proxies; delete -f names both kinds.
    assert manifests.parse_resources(POOL + "---\n" + PROXY, "f") == [documents[0]]
    proxy = documents[0]
    assert isinstance(proxy, ProxyResource)
    assert manifests.targets(documents) == [("crawl", "de-1", uid_of(proxy))]
    assert manifests.pools(documents) == [pool]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (("maxAge: 6h", "maxAge: 6x"), "document 1: spec.maxAge: '6x' is not a duration; use e.g."),
        (("replicas: 3", "replicas: -1"), "document 1: spec.replicas: must be from 0 to 10000"),
        (
            ("replicas: 3", f"replicas: {MAX_REPLICAS + 1}"),
            "document 1: spec.replicas: must be from 0 to 10000",
        ),
        (
            ("{provider: gcp}", "{provider: local}"),
            "document 1: spec.spread[1].provider: local is listed twice",
        ),
        (("name: de,", f"name: {'d' * 60},"), "document 1: metadata.name: use 1-57 lowercase"),
        (
            ("attributes: {country: de}", "attributes: {pool: other}"),
            "document 1: spec.template.attributes.pool: set by the pool on every member",
        ),
    ],
)
def test_an_invalid_pool_is_refused_naming_its_document_and_field(
    edit: tuple[str, str], said: str
) -> None:
    message = refusal(PROXY + "---\n" + POOL.replace(*edit))
    assert message.startswith("pools.yaml: "), message
    assert said.replace("document 1", "document 2") in message


def test_a_misspelt_pool_field_is_refused_with_the_closest_name_unless_told_to_warn(
    tmp_path: Path,
) -> None:
    text = POOL.replace("maxAge: 6h", "maxAge: 6h\n  recycleOnBlock: 3")
    refused = apply(tmp_path, text)
    assert refused.exit_code == 2, refused.output
    assert "document 1: spec.recycleOnBlock: unknown field; did you mean" in refused.output
    assert "spec.recycleOnBlocks" in refused.output
    assert "--validate=warn" in refused.output
    warned: list[str] = []
    [pool] = parse_documents(text, "pools.yaml", validate="warn", warn=warned.append)
    assert isinstance(pool, PoolDocument)
    assert pool.spec.recycle_on_blocks == 0
    assert len(warned) == 1
    assert "spec.recycleOnBlock" in warned[0]
    assert "ignored" in warned[0]


def test_a_misspelt_autoscale_field_is_refused_with_the_closest(tmp_path: Path) -> None:
    text = POOL.replace("maxAge: 6h", "maxAge: 6h\n  autoscale: {min: 1, mx: 5}")
    got = apply(tmp_path, text)
    assert got.exit_code == 2, got.output
    assert "spec.autoscale.mx" in got.output
    assert "spec.autoscale.max" in got.output


def test_one_bad_pool_refuses_the_proxies_beside_it_before_any_connection(tmp_path: Path) -> None:
    got = apply(tmp_path, PROXY + "---\n" + POOL.replace("replicas: 3", "replicas: -1"))
    # 2, not 3: the file was refused before the (absent) server was asked anything.
    assert got.exit_code == 2, got.output
    assert "document 2: spec.replicas" in got.output
    accepted = apply(tmp_path, PROXY + "---\n" + POOL)
    assert accepted.exit_code == 3, accepted.output


def test_a_document_of_another_kind_is_told_both_kinds() -> None:
    assert "document 1: kind: must be Proxy or ProxyPool" in refusal(PROXY.replace("Proxy", "Pod"))


def test_a_pool_on_a_provider_the_system_lacks_names_the_spread_entry() -> None:
    documents = parse_documents(PROXY + "---\n" + POOL, "f")
    refused = manifests.unknown_providers(documents, frozenset({"local"}), "s1")
    assert refused is not None
    assert refused.startswith("proxypool crawl/de: spec.spread[1].provider 'gcp':"), refused
    assert "crawl/de-1" not in refused
    assert manifests.unknown_providers(documents, frozenset({"local", "gcp"}), "s1") is None
    head = POOL.split("  spread:", maxsplit=1)[0]
    one = head.replace("attributes:", "provider: kvm\n    attributes:")
    without = manifests.unknown_providers(parse_documents(one, "f"), frozenset({"local"}), "s1")
    assert without is not None
    assert without.startswith("proxypool crawl/de: spec.template.provider 'kvm':"), without


def test_a_selector_takes_pairs_by_comma_and_by_flag_and_refuses_a_contradiction() -> None:
    selector = parse_selector(["pool=de,country=de", "tier = a"])
    assert selector == {"pool": "de", "country": "de", "tier": "a"}
    assert matches({"pool": "de", "country": "de", "tier": "a", "x": "y"}, selector)
    assert not matches({"pool": "de", "country": "de"}, selector)
    assert not matches({"pool": "fr", "country": "de", "tier": "a"}, selector)
    assert parse_selector(["pool=de", "pool=de"]) == {"pool": "de"}
    with pytest.raises(ValueError, match="given twice"):
        parse_selector(["pool=de", "pool=fr"])
    for bad in ("pool", "=de", "pool=de,,"):
        with pytest.raises(ValueError, match="write KEY=VALUE"):
            parse_selector([bad])


def test_get_refuses_a_bad_selector_and_an_unknown_kind_before_connecting() -> None:
    env = {"NATS_URL": None, "OTEL_SDK_DISABLED": "true"}
    url = ["--nats-url", "nats://127.0.0.1:1"]
    bad = CliRunner().invoke(main, ["get", "-l", "pool", *url], env=env)
    assert bad.exit_code == 2
    assert "-l" in bad.output
    assert "KEY=VALUE" in bad.output
    kind = CliRunner().invoke(main, ["get", "pods", *url], env=env)
    assert kind.exit_code == 2
    assert "proxies (the default) or pools" in kind.output
    both = CliRunner().invoke(main, ["get", "pools", "-l", "pool=de", *url], env=env)
    assert both.exit_code == 2
    assert "-l selects proxies" in both.output
