"""The Helm chart as rendered by the pinned ``helm``: ``helm lint`` passes, the default values
render the kustomize base's objects in substance (``tests.support.helm``), the files it shares
with deploy/ are copies of them, the schema names a wrong value's field, and each NetworkPolicy
admits exactly what its service needs, derived from the rendered objects themselves (its
ServiceAccount's grants, the NATS URL, the providers' proxy port, the Services); the gateway
knows the clients discovery knows and leases through the discovery Service.

No server: ``helm`` and ``kubectl kustomize`` only render. The install is test_helm_install.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services.discovery.http.access import CLIENTS_ENV
from services.providers.config import parse_providers_config
from services.providers.kubernetes.config import KubernetesConfig
from services.runtime.settings.shared import LOG_FORMATS, LOG_LEVELS
from tests.support.helm import (
    CHART,
    HELM_ONLY_KINDS,
    NAME_LABEL,
    RELEASE,
    Doc,
    Helm,
    by_key,
    differences,
    kustomize,
    of_kind,
)
from tests.support.peers import ROOT

pytestmark = pytest.mark.integration

DEPLOY = ROOT / "deploy"
COPIES = {
    CHART / "crds" / "proxies.yaml": DEPLOY / "crd" / "proxies.yaml",
    CHART / "crds" / "proxypools.yaml": DEPLOY / "crd" / "proxypools.yaml",
    CHART / "files" / "alerts.yaml": DEPLOY / "monitoring" / "alerts.yaml",
    CHART / "files" / "dashboard.json": DEPLOY / "monitoring" / "dashboard.json",
}
OPTIONS = (
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
    "services.discovery.clientsFile.enabled=true",
)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def defaults(helm: Helm) -> list[Doc]:
    return helm.template()


def test_helm_lint_passes_strictly_with_and_without_the_options(helm: Helm) -> None:
    for sets in ((), OPTIONS, ("networkPolicy.enabled=false", "podDisruptionBudget.enabled=false")):
        args = [arg for item in sets for arg in ("--set", item)]
        done = helm.run("lint", "--strict", str(CHART), *args)
        assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout, done.stdout


def test_the_default_values_render_the_kustomize_base(defaults: list[Doc]) -> None:
    problems = differences(kustomize(), defaults)
    assert not problems, "\n".join(problems)
    assert {d["kind"] for d in defaults} >= HELM_ONLY_KINDS | {"CustomResourceDefinition"}


def test_the_comparison_sees_a_changed_setting_env_or_rule(helm: Helm) -> None:
    changed = helm.template(
        "nats.url=nats://elsewhere:4222",
        "services.executor.env[0].name=GC_GRACE",
        "services.executor.env[0].value=1h",
    )
    problems = differences(kustomize(), changed)
    assert len(problems) == 2, problems
    assert "('ConfigMap', 'egress-proxies', 'egress-proxies-env') differs" in problems[0]
    assert "('Deployment', 'egress-proxies', 'egress-executor') differs" in problems[1]
    assert "GC_GRACE" in problems[1]
    # A rule the chart grants that kustomize does not is a difference too.
    docs = helm.template()
    (role,) = [
        d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == "egress-proxies-gc"
    ]
    role["rules"][0]["verbs"].append("create")
    assert "egress-proxies-gc') differs" in differences(kustomize(), docs)[0]


def test_the_chart_carries_deploys_generated_files_unchanged() -> None:
    for copy, source in COPIES.items():
        fix = f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}"
        assert copy.read_bytes() == source.read_bytes(), f"{copy.name} is stale: {fix}"


def test_monitoring_renders_the_alert_rules_and_the_dashboard(
    helm: Helm, defaults: list[Doc]
) -> None:
    docs = helm.template(*OPTIONS)
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((DEPLOY / "monitoring" / "alerts.yaml").read_text())
    (dashboard,) = [d for d in of_kind(docs, "ConfigMap") if "egress-proxies.json" in d["data"]]
    board = json.loads(dashboard["data"]["egress-proxies.json"])
    assert board == json.loads((DEPLOY / "monitoring" / "dashboard.json").read_text())
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not of_kind(defaults, "PrometheusRule")


def test_the_image_defaults_to_the_projects_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("services.watcher.replica=3", "additional properties 'replica' not allowed"),
        ("services.gc.replicas=two", "/services/gc/replicas"),
        ("log.level=verbose", "/log/level"),
        ("secrets.nats=Not_A_Name", "/secrets/nats"),
        ("networkPolicy.kubeApi.cidrs[0]=anywhere", "/networkPolicy/kubeApi/cidrs/0"),
        ("services.gateway.service.type=Ingress", "/services/gateway/service/type"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_field(helm: Helm, setting: str, named: str) -> None:
    done = helm.run("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert done.returncode != 0
    assert named in done.stderr, done.stderr


def test_the_schema_offers_what_the_services_accept() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    log = schema["properties"]["log"]["properties"]
    assert set(log["level"]["enum"]) == set(LOG_LEVELS)
    assert set(log["format"]["enum"]) == set(LOG_FORMATS)


def test_each_replicated_service_gets_a_disruption_budget(helm: Helm, defaults: list[Doc]) -> None:
    def budgeted(docs: list[Doc]) -> set[str]:
        for budget in of_kind(docs, "PodDisruptionBudget"):
            assert budget["spec"]["maxUnavailable"] == 1
        return {
            b["spec"]["selector"]["matchLabels"][NAME_LABEL]
            for b in of_kind(docs, "PodDisruptionBudget")
        }

    replicated = {
        d["metadata"]["name"] for d in of_kind(defaults, "Deployment") if d["spec"]["replicas"] > 1
    }
    assert budgeted(defaults) == replicated
    assert "egress-gc" not in replicated  # one replica: a budget would only block drains
    fewer = helm.template("services.health.replicas=1")
    assert budgeted(fewer) == replicated - {"egress-health"}


def test_the_release_namespace_reaches_every_object_and_binding(helm: Helm) -> None:
    docs = helm.template(namespace="egress-system")
    cluster_wide = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    for doc in docs:
        expected = None if doc["kind"] in cluster_wide else "egress-system"
        assert doc["metadata"].get("namespace") == expected, doc["metadata"]
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == "egress-system"


def test_the_clients_file_option_mounts_the_file_discovery_and_the_gateway_read(
    helm: Helm,
) -> None:
    docs = by_key(helm.template("services.discovery.clientsFile.enabled=true"))
    for service in ("discovery", "gateway"):
        deployment = docs[("Deployment", "egress-proxies", f"egress-{service}")]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        path = Path(env[CLIENTS_ENV])
        (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == "egress-proxies-discovery", service
        assert volume["secret"]["items"] == [{"key": "clients.yaml", "path": path.name}]


def _env(deployment: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_gateway_follows_the_discovery_service_and_its_clients(helm: Helm) -> None:
    docs = by_key(
        helm.template(
            "services.discovery.service.port=8081",
            "services.gateway.port=3128",
            "services.gateway.service.type=LoadBalancer",
            "services.gateway.service.port=8888",
            "services.gateway.replicas=3",
        )
    )
    gateway = docs[("Deployment", "egress-proxies", "egress-gateway")]
    discovery = docs[("Deployment", "egress-proxies", "egress-discovery")]
    env = _env(gateway)
    assert env["GATEWAY_API_URL"]["value"] == "http://egress-discovery:8081"
    assert env["GATEWAY_PORT"]["value"] == "3128"
    assert env["GATEWAY_HOST"]["value"] == "0.0.0.0"
    # The token discovery takes, so the gateway is never open; the chart never opens it.
    assert env["DISCOVERY_TOKEN"] == _env(discovery)["DISCOVERY_TOKEN"]
    assert "GATEWAY_INSECURE_OPEN" not in env
    assert gateway["spec"]["replicas"] == 3
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert {"name": "proxy", "containerPort": 3128} in container["ports"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "proxy"}
    service = docs[("Service", "egress-proxies", "egress-gateway")]
    assert service["spec"]["type"] == "LoadBalancer"
    assert {"name": "proxy", "port": 8888, "targetPort": "proxy"} in service["spec"]["ports"]


# ------------------------------------------------------------------------------ NetworkPolicy


def _ports(rules: list[dict[str, Any]]) -> set[tuple[object, str]]:
    return {(p["port"], p.get("protocol", "TCP")) for rule in rules for p in rule["ports"]}


def test_each_service_is_admitted_only_what_it_needs(defaults: list[Doc]) -> None:
    policies = of_kind(defaults, "NetworkPolicy")
    configs = {d["metadata"]["name"]: d["data"] for d in of_kind(defaults, "ConfigMap")}
    nats = urlsplit(configs["egress-proxies-env"]["NATS_URL"]).port
    entries = parse_providers_config(
        yaml.safe_load(configs["egress-proxies-providers"]["providers.yaml"]),
        source="the chart's providers",
        base_dir=Path(),
        default_data_dir=Path("/tmp/data"),
    )
    proxy_ports = {
        (e.config.port, "TCP") for e in entries if isinstance(e.config, KubernetesConfig)
    }
    assert proxy_ports
    bound = {s["name"] for b in defaults if b["kind"].endswith("Binding") for s in b["subjects"]}
    services = of_kind(defaults, "Service")
    deployments = {d["metadata"]["name"]: d for d in of_kind(defaults, "Deployment")}
    # The discovery API as the gateway reaches it: the pods' port behind the Service's.
    (discovery,) = [s for s in services if s["metadata"]["name"] == "egress-discovery"]
    (api_port,) = [
        p["containerPort"]
        for p in deployments["egress-discovery"]["spec"]["template"]["spec"]["containers"][0][
            "ports"
        ]
        for s in discovery["spec"]["ports"]
        if p["name"] == s["targetPort"] != "metrics"
    ]
    gateway_labels = deployments["egress-gateway"]["spec"]["template"]["metadata"]["labels"]
    dns = {(53, "UDP"), (53, "TCP")}
    api = {(443, "TCP"), (6443, "TCP")}
    for deployment in of_kind(defaults, "Deployment"):
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        pod = deployment["spec"]["template"]["spec"]
        (policy,) = [
            p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress", "Egress"]  # nothing else is admitted

        served = {p["name"] for p in pod["containers"][0]["ports"]}
        ingress = {("metrics", "TCP")}
        for service in services:
            if service["spec"]["selector"].items() <= labels.items():
                ingress |= {(p["targetPort"], "TCP") for p in service["spec"]["ports"]}
        assert _ports(spec["ingress"]) == ingress, name
        assert {port for port, _ in ingress} <= served, name

        # The API for the pods that carry a token, which are those whose account is bound.
        calls_api = pod["serviceAccountName"] in bound
        assert pod["automountServiceAccountToken"] is calls_api, name
        egress = dns | {(nats, "TCP")} | (api if calls_api else set())
        if name == "egress-health":  # it probes each proxy through the proxy itself
            egress |= proxy_ports
        if name == "egress-gateway":  # it leases from discovery and relays through the proxies
            egress |= proxy_ports | {(api_port, "TCP")}
        assert _ports(spec["egress"]) == egress, name
        for rule in spec["egress"]:
            if _ports([rule]) <= api | proxy_ports:
                assert all(set(peer) == {"ipBlock"} for peer in rule["to"]), name
            if _ports([rule]) == {(api_port, "TCP")}:
                (peer,) = rule["to"]
                selected = peer["podSelector"]["matchLabels"].items()
                assert selected <= deployments["egress-discovery"]["metadata"]["labels"].items()
        if name == "egress-discovery":  # the gateway's leases, whatever discoveryFrom says
            admitted = [
                rule
                for rule in spec["ingress"]
                if _ports([rule]) == {("http", "TCP")}
                and any(
                    set(peer) == {"podSelector"}
                    and peer["podSelector"]["matchLabels"]
                    and peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
                    for peer in rule.get("from", [])
                )
            ]
            assert admitted, "discovery's policy does not admit the gateway"


def test_provider_and_extra_egress_reach_the_services_they_are_for(helm: Helm) -> None:
    docs = helm.template(
        "networkPolicy.providerEgress[0].ports[0].port=22",
        "networkPolicy.extraEgress[0].ports[0].port=4317",
    )
    for policy in of_kind(docs, "NetworkPolicy"):
        ports = {port for port, _ in _ports(policy["spec"]["egress"])}
        name = policy["metadata"]["name"]
        assert (22 in ports) is (name in ("egress-executor", "egress-gc")), name
        assert 4317 in ports, name
