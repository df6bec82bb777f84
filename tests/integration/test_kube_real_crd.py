"""The committed CRD and kustomize base against a real kube-apiserver: the schema is structural and
its CEL rules fit the cost budget (the server refuses the CRD otherwise), the rules refuse bad
Proxies with their messages, and ``kubectl apply -k deploy/`` is accepted as a whole."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.apiserver import CRD, DEPLOY, SYSTEM_NAMESPACE, ApiServer

pytestmark = pytest.mark.integration


def proxy(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def test_crd_is_accepted_and_established(apiserver: ApiServer) -> None:
    done = apiserver.kubectl("apply", "-f", str(CRD))
    assert "customresourcedefinition.apiextensions.k8s.io/proxies.crawl.example.com" in done.stdout
    apiserver.kubectl(
        "wait", "--for=condition=Established", "crd/proxies.crawl.example.com", "--timeout=60s"
    )
    crd = apiserver.get("crd", "proxies.crawl.example.com", "")
    assert crd is not None
    conditions = {c["type"]: c for c in crd["status"]["conditions"]}
    # A non-structural schema would show up here (and CEL rules would be refused outright).
    assert conditions.get("NonStructuralSchema", {}).get("status") != "True"
    assert conditions["Established"]["status"] == "True"
    assert conditions["NamesAccepted"]["status"] == "True"
    # The short name and categories work through discovery.
    names = apiserver.kubectl("api-resources", "--api-group=crawl.example.com", "-o", "wide")
    assert "px" in names.stdout
    assert "egress" in names.stdout
    assert "crawl" in names.stdout


def test_valid_examples_pass_server_side_validation(apiserver: ApiServer) -> None:
    apiserver.kubectl("apply", "-f", str(CRD))
    namespace = apiserver.namespace("crd")
    for example in ("proxy.yaml", "proxy-external.yaml", "kvm-proxy.yaml", "gcp-proxy.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / "examples" / example).read_text()):
            if doc is None:
                continue
            doc["metadata"]["namespace"] = namespace
            done = apiserver.kubectl(
                "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False
            )
            assert done.returncode == 0, f"{example}: {done.stderr}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"attributes": {"pool": "default"}},
            "provider is required for mode Managed: the name of a provider instance",
        ),
        ({"mode": "External"}, "external.url is required for mode External"),
        (
            {"provider": "local", "external": {"url": "http://10.0.0.1:3128"}},
            "external.url is only for mode External",
        ),
        (
            {
                "provider": "gcp",
                "cloudInit": {"inline": "#cloud-config", "secretRef": {"name": "s"}},
            },
            "set either inline or secretRef, not both",
        ),
    ],
)
def test_invalid_proxy_is_refused_with_the_rule_message(
    apiserver: ApiServer, spec: dict[str, Any], message: str
) -> None:
    apiserver.kubectl("apply", "-f", str(CRD))
    namespace = apiserver.namespace("crd")
    done = apiserver.apply(proxy(namespace, "bad", **spec), check=False)
    assert done.returncode != 0
    assert "Invalid value" in done.stderr
    assert message in done.stderr, done.stderr
    assert apiserver.get("px", "bad", namespace) is None


def test_unknown_and_mistyped_fields_are_refused_by_the_schema(apiserver: ApiServer) -> None:
    apiserver.kubectl("apply", "-f", str(CRD))
    namespace = apiserver.namespace("crd")
    done = apiserver.apply(
        proxy(namespace, "bad", provider="local", healthCheck={"intervalSeconds": "often"}),
        check=False,
    )
    assert done.returncode != 0
    assert "healthCheck.intervalSeconds" in done.stderr, done.stderr


def test_kustomize_base_is_applied(apiserver: ApiServer) -> None:
    done = apiserver.deploy_base()
    for kind_name in (
        "namespace/egress-proxies",
        "serviceaccount/egress-watcher",
        "serviceaccount/egress-executor",
        "serviceaccount/egress-gc",
        "serviceaccount/egress-no-api",
        "clusterrole.rbac.authorization.k8s.io/egress-proxies-watcher",
        "role.rbac.authorization.k8s.io/egress-proxies-leader-election",
        "deployment.apps/egress-watcher",
        "customresourcedefinition.apiextensions.k8s.io/proxypools.crawl.example.com",
    ):
        assert kind_name in done.stdout, done.stdout
    accounts = apiserver.kubectl("get", "sa", "-n", SYSTEM_NAMESPACE, "-o", "name").stdout
    assert "serviceaccount/egress-watcher" in accounts


@pytest.mark.parametrize(
    ("account", "allowed", "refused"),
    [
        (
            "egress-watcher",
            [
                "list proxies.crawl.example.com --all-namespaces",
                "watch proxies.crawl.example.com --all-namespaces",
                "patch proxies.crawl.example.com/status -n default",
                "create events -n default",
                "update leases.coordination.k8s.io -n egress-proxies",
                "watch proxypools.crawl.example.com --all-namespaces",
                "patch proxypools.crawl.example.com/status -n default",
                # The Proxies that mirror pool members.
                "create proxies.crawl.example.com -n default",
                "delete proxies.crawl.example.com -n default",
            ],
            [
                "delete proxypools.crawl.example.com -n default",
                "create proxypools.crawl.example.com -n default",
                "update proxies.crawl.example.com -n default",
                "create pods -n default",
                "update leases.coordination.k8s.io -n default",
            ],
        ),
        (
            "egress-executor",
            ["create pods -n default", "delete pods -n default", "get pods -n default"],
            ["list proxies.crawl.example.com -n default", "list secrets -n default"],
        ),
        ("egress-gc", ["list pods --all-namespaces", "delete pods -n x"], ["create pods -n x"]),
        ("egress-no-api", [], ["list pods -n default", "get proxies.crawl.example.com -n x"]),
    ],
)
def test_service_accounts_get_what_their_code_uses_and_no_more(
    apiserver: ApiServer, account: str, allowed: list[str], refused: list[str]
) -> None:
    """RBAC decided by the server, for a token the server issued to each ServiceAccount."""
    apiserver.deploy_base()
    kubeconfig = apiserver.kubeconfig_for(SYSTEM_NAMESPACE, account)
    who = apiserver.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    assert f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}" in who.stdout
    for question, expected in [(q, "yes") for q in allowed] + [(q, "no") for q in refused]:
        done = apiserver.kubectl(
            "auth", "can-i", *question.split(), kubeconfig=kubeconfig, check=False
        )
        assert done.stdout.strip() == expected, f"{account}: can-i {question}: {done.stdout}"
