"""The preflight's and the catalogue check's verdicts, row by row, and the catalogue cache's
bounds in time and size (D140)."""

from __future__ import annotations

import pytest

from services.providers.gcp.catalogue import Cache
from services.providers.gcp.pure import checks
from services.providers.gcp.pure.checks import Rule


def test_a_machine_type_path_names_its_own_zone() -> None:
    assert checks.machine_type_in("europe-west1-b", "e2-small") == ("europe-west1-b", "e2-small")
    assert checks.machine_type_in("europe-west1-b", "zones/us-east1-c/machineTypes/e2-micro") == (
        "us-east1-c",
        "e2-micro",
    )
    assert checks.is_custom("e2-custom-2-4096")
    assert not checks.is_custom("c3-standard-4")


def test_the_refusal_names_the_fields_and_the_zones_of_the_same_region_first() -> None:
    zones = ["us-central1-a", "europe-west4-a", "europe-west1-d", "asia-east1-a"]
    message = checks.not_offered("c3-standard-4", "europe-west1-b", zones)
    assert "machineType 'c3-standard-4' is not offered in zone 'europe-west1-b'" in message
    assert "spec.placement.machineType or gcp.machineType" in message
    assert message.endswith(
        "it is offered in europe-west1-d, asia-east1-a, europe-west4-a, us-central1-a"
    )
    many = [f"us-east{n}-a" for n in range(20)]
    assert checks.where_offered("europe-west1-b", many, shown=3).endswith("and 17 more")
    assert checks.where_offered("europe-west1-b", []) == (
        "it is offered in no zone this project can use"
    )


def test_the_cpu_quota_is_the_series_own_where_the_region_has_one() -> None:
    assert checks.cpu_metric("e2-small", {"CPUS", "E2_CPUS"}) == "E2_CPUS"
    assert checks.cpu_metric("e2-small", {"CPUS"}) == "CPUS"
    assert checks.cpu_metric("n1-standard-1", {"CPUS", "E2_CPUS"}) == "CPUS"


def test_headroom_per_metric() -> None:
    quotas = {"CPUS": (24.0, 23.0), "INSTANCES": (10.0, 3.0)}
    rooms = checks.headroom(quotas, {"CPUS": 2.0, "INSTANCES": 1.0, "IN_USE_ADDRESSES": 1.0})
    assert [(r.metric, r.ok) for r in rooms] == [
        ("CPUS", False),
        ("INSTANCES", True),
        ("IN_USE_ADDRESSES", True),
    ]
    assert rooms[0].detail == "CPUS: 23 of 24 used, 1 free, one VM needs 2"
    assert rooms[2].detail == "IN_USE_ADDRESSES: not reported by the region"


NET = "https://www.googleapis.com/compute/v1/projects/p1/global/networks/default"


def _rule(**kw: object) -> Rule:
    settings: dict[str, object] = {
        "name": "r",
        "network": NET,
        "direction": "INGRESS",
        "disabled": False,
        "allowed": [("tcp", ["3128"])],
        "target_tags": ["egress-proxy"],
        "source_ranges": ["203.0.113.0/24"],
    }
    settings.update(kw)
    return Rule(**settings)  # type: ignore[arg-type]  # the test's own keyword table


@pytest.mark.parametrize(
    ("rule", "opens"),
    [
        (_rule(), True),
        (_rule(allowed=[("tcp", ["3000-4000"])]), True),
        (_rule(allowed=[("tcp", [])]), True),
        (_rule(allowed=[("all", [])]), True),
        (_rule(target_tags=[]), True),  # every instance of the network
        (_rule(allowed=[("tcp", ["22"])]), False),
        (_rule(allowed=[("udp", ["3128"])]), False),
        (_rule(target_tags=["web"]), False),
        (_rule(direction="EGRESS"), False),
        (_rule(disabled=True), False),
        (_rule(target_tags=[], target_service_accounts=["other@p1.iam"]), False),
        (_rule(source_ranges=["0.0.0.0/0"]), True),
        (_rule(source_ranges=["10.128.0.0/9", "192.168.0.0/16"]), False),  # internal only
        (_rule(source_ranges=[]), False),  # source tags only: VMs of the network
        (_rule(source_ranges=["fd00::/8", "2001:db8::/32"]), True),
    ],
)
def test_which_rules_open_the_proxy_port(rule: Rule, opens: bool) -> None:
    assert checks.opens(rule, tag="egress-proxy", service_account="", port=3128) is opens


def test_a_rule_belongs_to_the_entry_network_by_project_and_name() -> None:
    assert checks.same_network(NET, "default", "p1")
    assert not checks.same_network(NET, "default", "p2")
    assert checks.same_network(NET, "projects/p1/global/networks/default", "p2")
    assert not checks.same_network(NET, "egress-vpc", "p1")


def test_the_cache_is_bounded_in_time_and_size() -> None:
    now = [0.0]
    cache = Cache(ttl=60.0, size=2, clock=lambda: now[0])
    asked: list[str] = []

    def ask(value: str) -> str:
        asked.append(value)
        return value

    assert cache.get_or(("a",), lambda: ask("a1")) == "a1"
    now[0] = 59.0
    assert cache.get_or(("a",), lambda: ask("a2")) == "a1"  # still fresh
    now[0] = 61.0
    assert cache.get_or(("a",), lambda: ask("a3")) == "a3"  # an hour-old answer is asked again
    cache.get_or(("b",), lambda: ask("b"))
    cache.get_or(("c",), lambda: ask("c"))
    assert len(cache) == 2  # the oldest went
    assert cache.get_or(("a",), lambda: ask("a4")) == "a4"

    def fails() -> str:
        raise RuntimeError("no answer")

    with pytest.raises(RuntimeError):
        cache.get_or(("d",), fails)
    assert cache.get_or(("d",), lambda: ask("d")) == "d"  # a failure is not cached
    assert asked == ["a1", "a3", "b", "c", "a4", "d"]
