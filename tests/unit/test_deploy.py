"""deploy/: every manifest parses and is what it claims, the kustomize base is complete, the
Deployments run real commands with real flags and settings, and RBAC grants each service account
exactly what its code calls (derived from the code, so a new API call without a rule fails here).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from services.cli.main import main
from services.cli.run.registry import SERVICES
from services.providers.config import build_providers, parse_providers_config
from services.runtime.nats.users import (
    USERS,
    WRITES,
    authorization_conf,
    password_variable,
    permissions,
)
from services.runtime.settings.shared import Settings
from tests.support.clirun import run_parsed, variables_of

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
Doc = dict[str, Any]

KINDS = {
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("crawl.example.com/v1alpha1", "Proxy"),
    ("crawl.example.com/v1alpha1", "ProxyPool"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}
# Variables the code reads outside click parameters: leader identity, the API token.
OTHER_ENV = {"POD_NAME", "DISCOVERY_TOKEN"}


def yaml_files() -> list[Path]:
    # The Helm chart's templates are YAML only once rendered: tests/integration/test_helm_chart.py
    # renders the chart and compares it with this base.
    helm = DEPLOY / "helm"
    return sorted(
        p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and helm not in p.parents
    )


def docs_of(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization() -> Doc:
    doc: Doc = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return doc


def base_docs() -> list[Doc]:
    return [d for name in kustomization()["resources"] for d in docs_of(DEPLOY / name)]


def of_kind(kind: str) -> list[Doc]:
    return [d for d in base_docs() if d["kind"] == kind]


def test_every_yaml_parses_and_is_a_known_kind() -> None:
    assert yaml_files()
    for path in yaml_files():
        for doc in docs_of(path):
            assert isinstance(doc, dict), path
            if "kind" not in doc:
                # No manifests: Helm values, providers configs and Prometheus rules (whose
                # checks are in test_monitoring).
                assert (
                    path == DEPLOY / "nats" / "values.yaml"
                    or "providers" in doc
                    or (path.parent.name == "monitoring" and "groups" in doc)
                ), path
                continue
            assert (doc.get("apiVersion"), doc["kind"]) in KINDS, f"{path}: {doc['kind']}"
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path


def test_the_kustomization_lists_every_manifest_and_nothing_missing() -> None:
    listed = {DEPLOY / name for name in kustomization()["resources"]}
    assert all(path.is_file() for path in listed), sorted(p for p in listed if not p.is_file())
    manifests = {
        path
        for path in yaml_files()
        if path.parent.name not in ("examples", "nats", "monitoring")
        and path.name != "kustomization.yaml"
    }
    assert manifests == listed
    assert kustomization()["namespace"] == "egress-proxies"
    assert {img["name"] for img in kustomization()["images"]} == {"egress-proxies"}


def nats_values() -> Doc:
    values: Doc = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    return values


def test_nats_values_ask_for_a_three_node_jetstream_on_disk() -> None:
    values = nats_values()
    assert values["config"]["cluster"]["enabled"] is True
    assert values["config"]["cluster"]["replicas"] == 3
    assert values["config"]["jetstream"]["enabled"] is True
    assert values["config"]["jetstream"]["fileStore"]["enabled"] is True


NATS_SECRET = "egress-proxies-nats"


def test_nats_values_grant_each_user_exactly_what_the_code_grants() -> None:
    values = nats_values()
    users = values["config"]["merge"]["authorization"]["users"]
    assert [u["user"] for u in users] == list(USERS)
    env = values["container"]["env"]
    for user in users:
        name = user["user"]
        # The chart writes << ... >> unquoted: the server reads the password from the variable.
        assert user["password"] == f"<< ${password_variable(name)} >>"
        assert user.get("permissions") == permissions(name), name
        ref = env[password_variable(name)]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": NATS_SECRET, "key": name}
    assert set(env) == {password_variable(u) for u in USERS}


def test_nats_conf_has_the_users_the_code_grants() -> None:
    conf = (ROOT / "nats.conf").read_text()
    assert authorization_conf(lambda user: f"${password_variable(user)}") in conf
    assert "sync_interval: always" in conf


def test_compose_gives_the_server_every_password_and_each_service_its_own() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    server_env = services["nats"]["environment"]
    assert set(server_env) == {password_variable(u) for u in USERS}
    for user in USERS:
        assert server_env[password_variable(user)].startswith(f"${{{password_variable(user)}:?")
    runs = {name: svc for name, svc in services.items() if name != "nats"}
    assert set(runs) == set(WRITES) - {"watcher"}  # the watcher needs a cluster
    for name, svc in runs.items():
        assert svc["command"] == ["run", name]
        env = svc["environment"]
        assert env["NATS_USER"] == name
        assert env["NATS_PASSWORD"].startswith(f"${{{password_variable(name)}:?")
        command, _ = leaf_command(svc["command"])
        known = variables_of(command) | OTHER_ENV
        assert set(env) <= known, f"{name}: nothing reads {sorted(set(env) - known)}"


def env_config() -> dict[str, str]:
    (config,) = [d for d in of_kind("ConfigMap") if d["metadata"]["name"] == "egress-proxies-env"]
    data: dict[str, str] = config["data"]
    return data


def test_the_shared_settings_are_valid_for_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = started_with(["run", "reconciler"], env_config(), monkeypatch)
    assert settings.stream_replicas == 3
    assert settings.metrics_host == "0.0.0.0"
    assert settings.nats_url.startswith("nats://nats")


def providers_configs() -> Iterator[tuple[str, object]]:
    for config in of_kind("ConfigMap") + [
        d for p in (DEPLOY / "examples").glob("*.yaml") for d in docs_of(p)
    ]:
        if config.get("kind") == "ConfigMap" and "providers.yaml" in config.get("data", {}):
            yield config["metadata"]["name"], yaml.safe_load(config["data"]["providers.yaml"])
        elif "providers" in config and "kind" not in config:
            yield "examples", config


def test_providers_configs_parse_and_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # as in a pod
    found = list(providers_configs())
    assert len(found) >= 3
    for source, raw in found:
        entries = parse_providers_config(
            raw, source=source, base_dir=Path(), default_data_dir=Path("/tmp/data")
        )
        kinds = {entry.type for entry in entries}
        providers = build_providers([e for e in entries if e.type == "kubernetes"])
        assert kinds <= {
            "kubernetes",
            "gcp",
            "kvm",
            "aws",
            "digitalocean",
            "hetzner",
            "upstream",
        }, source
        assert all(p.type == "kubernetes" for p in providers.values())


def containers() -> Iterator[tuple[Doc, Doc]]:
    for deployment in of_kind("Deployment"):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield deployment, container


def leaf_command(args: list[str]) -> tuple[click.Command, list[str]]:
    assert args[0] == "run", args
    run = main.commands["run"]
    assert isinstance(run, click.Group)
    command = run.get_command(click.Context(run), args[1])
    assert command is not None, f"`egress-proxies run {args[1]}` does not exist"
    return command, args[2:]


def started_with(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings ``egress-proxies run NAME`` starts its service with under ``env`` alone."""
    unset: dict[str, str | None] = dict.fromkeys(OTHER_ENV)
    result, settings = run_parsed(args, unset | env, monkeypatch)
    assert result.exit_code == 0, f"{args}: {result.output}"
    assert settings is not None
    return settings


def test_deployments_run_real_commands_with_real_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = set()
    for deployment, container in containers():
        command, _ = leaf_command(container["args"])
        services.add(container["args"][1])
        env = dict(env_config())
        for item in container.get("env", []):
            env[item["name"]] = item.get("value", "from-the-cluster")
        known = variables_of(command) | OTHER_ENV
        unknown = set(env) - known
        assert not unknown, f"{deployment['metadata']['name']}: nothing reads {sorted(unknown)}"
        if "PROVIDERS_CONFIG" in env:
            # The mounted ConfigMap, as a file, so click's exists=True check runs for real.
            (name,) = [
                v["configMap"]["name"]
                for v in deployment["spec"]["template"]["spec"]["volumes"]
                if "configMap" in v
            ]
            (raw,) = [
                c["data"]["providers.yaml"]
                for c in of_kind("ConfigMap")
                if c["metadata"]["name"] == name
            ]
            (tmp_path / "providers.yaml").write_text(raw)
            env["PROVIDERS_CONFIG"] = str(tmp_path / "providers.yaml")
        settings = started_with(container["args"], env, monkeypatch)
        assert settings.service_name == f"egress-proxies-{container['args'][1]}"
        assert settings.nats_user == container["args"][1], "each service logs in as itself"
    assert services == set(SERVICES), "each service `run` knows has one Deployment"


def test_probes_and_services_point_at_declared_ports() -> None:
    env = env_config()
    for deployment, container in containers():
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == int(env["METRICS_PORT"])
        for probe in ("readinessProbe", "livenessProbe"):
            if "tcpSocket" in container[probe]:  # the gateway's: its proxy port accepts
                assert container[probe]["tcpSocket"]["port"] in ports
                continue
            target = container[probe]["httpGet"]
            assert target["path"] == "/healthz"
            assert target["port"] in ports
        template = deployment["spec"]["template"]
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= template["metadata"]["labels"].items()
        )
    # Each Service selects one Deployment's pods and forwards to ports its container names.
    fronted = set()
    for service in of_kind("Service"):
        (pod,) = [
            d
            for d in of_kind("Deployment")
            if service["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        (container,) = pod["spec"]["template"]["spec"]["containers"]
        names = {p["name"] for p in container["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
        fronted.add(container["args"][1])
    assert fronted == {"discovery", "gateway"}
    discovery = container_of("discovery")
    value = {e["name"]: e.get("value") for e in discovery["env"]}
    assert int(value["DISCOVERY_PORT"]) == port_of(discovery, "http")
    assert value["DISCOVERY_HOST"] == "0.0.0.0"


def container_of(service: str) -> Doc:
    (container,) = [c for _, c in containers() if c["args"][1] == service]
    return container


def port_of(container: Doc, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


def test_the_gateway_serves_the_cluster_and_leases_through_the_discovery_service() -> None:
    gateway = container_of("gateway")
    value = {e["name"]: e.get("value") for e in gateway["env"]}
    assert value["GATEWAY_HOST"] == "0.0.0.0"
    assert int(value["GATEWAY_PORT"]) == port_of(gateway, "proxy")
    (front,) = [s for s in of_kind("Service") if s["metadata"]["name"] == "egress-gateway"]
    assert {p["port"] for p in front["spec"]["ports"] if p["targetPort"] == "proxy"} == {8000}
    # --api-url names the discovery Service on the port that reaches the API.
    api = urlsplit(value["GATEWAY_API_URL"])
    (service,) = [s for s in of_kind("Service") if s["metadata"]["name"] == api.hostname]
    (http,) = [p for p in service["spec"]["ports"] if p["port"] == (api.port or 80)]
    assert http["targetPort"] == "http"
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "egress-discovery"}
    # Never an open proxy: the clients discovery knows, DISCOVERY_TOKEN's at least, and no
    # --insecure-open (test_deployments_run_real_commands_with_real_settings builds it so).
    assert "GATEWAY_INSECURE_OPEN" not in value
    (token,) = [e for e in gateway["env"] if e["name"] == "DISCOVERY_TOKEN"]
    (same,) = [e for e in container_of("discovery")["env"] if e["name"] == "DISCOVERY_TOKEN"]
    assert token == same


def test_each_service_logs_in_to_nats_as_its_own_user() -> None:
    assert "NATS_USER" not in env_config()
    assert "NATS_PASSWORD" not in env_config()
    found = set()
    for _, container in containers():
        service = container["args"][1]
        env = {e["name"]: e for e in container["env"]}
        assert env["NATS_USER"]["value"] == service
        ref = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": NATS_SECRET, "key": service}
        found.add(service)
    assert found == set(WRITES)


def test_the_watcher_elects_a_leader_among_replicas() -> None:
    (watcher,) = [d for d, c in containers() if c["args"][1] == "watcher"]
    assert watcher["spec"]["replicas"] >= 2
    env = {e["name"]: e for e in watcher["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LEADER_ELECTION"]["value"] == "true"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


# ----------------------------------------------------------------------------- RBAC from the code

_CALL = re.compile(
    r"\.(create|read|get|patch|replace|delete|list)_(?:namespaced_|cluster_)?([a-z_]+?)"
    r"(?:_for_all_namespaces)?\b"
)
_STREAMED = re.compile(r"stream\(\s*[\w.]*\.list_(?:namespaced_|cluster_)?([a-z_]+?)\b")
_VERBS = {"create": "create", "read": "get", "get": "get", "patch": "patch"}
_VERBS |= {"replace": "update", "delete": "delete", "list": "list"}
_RESOURCES = {
    "pod": ("", "pods"),
    "secret": ("", "secrets"),
    "event": ("", "events"),
    "lease": ("coordination.k8s.io", "leases"),
    "custom_object": ("crawl.example.com", "proxies"),
    "custom_object_status": ("crawl.example.com", "proxies/status"),
}
Need = set[tuple[str, str, str]]  # (apiGroup, resource, verb)


def _arguments(source: str, start: int) -> str:
    """The text of the call whose name ends at ``start``: up to its closing parenthesis."""
    depth, end = 0, start
    for end in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        if depth == 0 and end > start:
            break
    return source[start : end + 1]


# An API built on the watcher's generic custom-object layer names its plural so; the layer's calls
# name ``self.plural``.
_BUILT_FOR = re.compile(r"\bplural=(POOL_PLURAL|PLURAL)\b")


def _resources(noun: str, arguments: str, built_for: set[str]) -> set[tuple[str, str]]:
    """A custom object call names its resource by plural: ``POOL_PLURAL`` is ProxyPools, and the
    generic layer's ``self.plural`` each plural an API is built with."""
    group, resource = _RESOURCES[noun]
    if not noun.startswith("custom_object"):
        return {(group, resource)}
    if "self.plural" in arguments:
        plurals = built_for
    else:
        plurals = {"POOL_PLURAL" if "POOL_PLURAL" in arguments else "PLURAL"}
    pools = resource.replace("proxies", "proxypools")
    return {(group, pools if plural == "POOL_PLURAL" else resource) for plural in plurals}


def needs_of(source: str, built_for: set[str] | None = None) -> Need:
    built_for = set(_BUILT_FOR.findall(source)) if built_for is None else built_for
    needs: Need = set()
    for match in _CALL.finditer(source):
        verb, found = match.groups()
        noun = found.removesuffix("_for_all_namespaces")
        if noun in _RESOURCES:
            arguments = _arguments(source, source.find("(", match.end()))
            needs |= {(*r, _VERBS[verb]) for r in _resources(noun, arguments, built_for)}
    for match in _STREAMED.finditer(source):
        noun = match.group(1).removesuffix("_for_all_namespaces")
        if noun in _RESOURCES:
            arguments = _arguments(source, match.start() + source[match.start() :].find("("))
            needs |= {(*r, "watch") for r in _resources(noun, arguments, built_for)}
    if "LeaseLock(" in source:  # kubernetes_asyncio's lock reads, creates and replaces
        needs |= {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    return needs


def code_needs(service: str) -> Need:
    provider = ROOT / "services" / "providers" / "kubernetes"
    if service == "watcher":
        sources = [f.read_text() for f in sorted((ROOT / "services" / "watcher").rglob("*.py"))]
        built_for = set(_BUILT_FOR.findall("\n".join(sources)))
        return set().union(*(needs_of(source, built_for) for source in sources))
    if service == "executor":
        return set().union(*(needs_of(f.read_text()) for f in provider.glob("*.py")))
    if service == "gc":  # gc calls list_by_tag and delete, nothing else of the provider
        tree = ast.parse((provider / "provider.py").read_text())
        bodies = [
            ast.unparse(node)
            for node in ast.walk(tree)
            if isinstance(node, ast.AsyncFunctionDef) and node.name in ("list_by_tag", "delete")
        ]
        return needs_of("\n".join(bodies))
    return set()


# Events may be patched (a count) by either Events API; the finalizers subresources are checked
# only by the OwnerReferencesPermissionEnforcement admission plugin (a finalizer, and a mirror's
# ownerReference with blockOwnerDeletion).
LENIENCY: Need = {
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("crawl.example.com", "proxies/finalizers", "update"),
    ("crawl.example.com", "proxypools/finalizers", "update"),
}


def grants(service_account: str) -> Need:
    roles = {(d["kind"], d["metadata"]["name"]): d for d in base_docs() if "rules" in d}
    granted: Need = set()
    for binding in of_kind("ClusterRoleBinding") + of_kind("RoleBinding"):
        if not any(s["name"] == service_account for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


# Every service: one the code scan knows nothing of must run with no token and no grants.
@pytest.mark.parametrize("service", sorted(SERVICES))
def test_rbac_covers_what_the_code_calls_and_no_more(service: str) -> None:
    (deployment,) = [d for d, c in containers() if c["args"][1] == service]
    pod = deployment["spec"]["template"]["spec"]
    needs = code_needs(service)
    granted = grants(pod["serviceAccountName"])
    assert needs <= granted, f"{service} calls without permission: {sorted(needs - granted)}"
    if not needs:
        assert pod["automountServiceAccountToken"] is False
        assert granted == set()
    else:
        # Nothing beyond the calls, except what Kubernetes itself may check on our behalf.
        extra = granted - needs - LENIENCY
        assert not extra, f"{service} may do what its code never does: {sorted(extra)}"


def test_the_code_scan_finds_calls() -> None:
    assert ("", "pods", "create") in code_needs("executor")
    assert code_needs("gc") == {("", "pods", "list"), ("", "pods", "delete")}
    assert ("crawl.example.com", "proxies/status", "patch") in code_needs("watcher")
    assert ("coordination.k8s.io", "leases", "update") in code_needs("watcher")
    watcher = code_needs("watcher")
    pools = {(g, r, v) for g, r, v in watcher if r.startswith("proxypools")}
    assert pools == {
        ("crawl.example.com", "proxypools", "list"),
        ("crawl.example.com", "proxypools", "watch"),
        ("crawl.example.com", "proxypools", "get"),
        ("crawl.example.com", "proxypools", "patch"),
        ("crawl.example.com", "proxypools/status", "patch"),
    }
    assert {("crawl.example.com", "proxies", v) for v in ("create", "delete", "watch")} <= watcher
