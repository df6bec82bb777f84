"""The Helm chart (deploy/helm/egress-proxies) and the kustomize base it must match: ``Helm`` runs
the pinned ``helm`` (built by deploy/peers.sh beside kubectl) with a home of its own, and
``substance`` reduces a rendered object to what both installs must agree on.

What the chart may add without counting as a difference (``HELM_ONLY_KINDS`` and
``substance``): PodDisruptionBudgets and NetworkPolicies, Helm's labels and the pods'
``checksum/config`` annotation, an explicit ``imagePullPolicy`` and Service ``type``, and the
image's tag (the chart's appVersion where kustomize says ``latest``). The Namespace is
kustomize's alone: Helm installs into one (``--create-namespace``). Everything else, RBAC rules,
container args, env and probes, the CRD's schema, must be equal.
"""

from __future__ import annotations

import copy
import difflib
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.peers import ROOT, peer, peers_dir

CHART = ROOT / "deploy" / "helm" / "egress-proxies"
KUSTOMIZE = ROOT / "deploy"
RELEASE = "egress-proxies"
NAMESPACE = "egress-proxies"
"""The kustomize base's namespace, and so the release's for the comparison."""
HELM_ONLY_KINDS = frozenset({"PodDisruptionBudget", "NetworkPolicy"})
KUSTOMIZE_ONLY_KINDS = frozenset({"Namespace"})
NAME_LABEL = "app.kubernetes.io/name"
"""The one label that selects: the chart keeps kustomize's selectors unchanged."""
Doc = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name


def helm_binary() -> Path:
    path = peers_dir() / "helm"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: run `make peers` (deploy/peers.sh) to build it")
    return path


@dataclass(frozen=True)
class Helm:
    """``helm`` with its cache, config and data under ``home``, so that no test reads or writes
    the user's repositories or registry logins."""

    home: Path

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.home),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        command = [str(helm_binary()), *args]
        if kubeconfig is not None:
            command.append(f"--kubeconfig={kubeconfig}")
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=180, check=False, cwd=ROOT
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def template(self, *sets: str, namespace: str = NAMESPACE) -> list[Doc]:
        """``helm template`` of the chart with its CRD; ``sets`` are ``--set`` arguments."""
        args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds"]
        for item in sets:
            args += ["--set", item]
        return parse(self.run(*args).stdout)


def kustomize() -> list[Doc]:
    """``kubectl kustomize deploy/``: what ``kubectl apply -k deploy/`` would create."""
    done = subprocess.run(
        [str(peer("kubectl")), "kustomize", str(KUSTOMIZE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize deploy/ exited {done.returncode}:\n{done.stderr}")
    return parse(done.stdout)


def parse(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def key(doc: Doc) -> Key:
    meta = doc["metadata"]
    return doc["kind"], meta.get("namespace", ""), meta["name"]


def by_key(docs: Iterable[Doc]) -> dict[Key, Doc]:
    found: dict[Key, Doc] = {}
    for doc in docs:
        assert key(doc) not in found, f"{key(doc)} rendered twice"
        found[key(doc)] = doc
    return found


def of_kind(docs: Iterable[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def _metadata(meta: Doc) -> Doc:
    kept = {k: v for k, v in meta.items() if k not in ("labels", "annotations")}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k == NAME_LABEL}
    if labels:
        kept["labels"] = labels
    return kept


def substance(doc: Doc) -> Doc:
    """``doc`` without what the chart may add or word differently (the module's docstring)."""
    out = copy.deepcopy(doc)
    out["metadata"] = _metadata(out["metadata"])
    if doc["kind"] == "CustomResourceDefinition":
        # The whole CRD counts, its own labels included (it is the generated file, unchanged).
        out["metadata"]["labels"] = doc["metadata"].get("labels", {})
    if doc["kind"] == "ConfigMap" and "providers.yaml" in doc.get("data", {}):
        out["data"]["providers.yaml"] = yaml.safe_load(doc["data"]["providers.yaml"])
    if doc["kind"] == "Service":
        out["spec"].setdefault("type", "ClusterIP")  # the default, which the chart spells out
    if doc["kind"] == "Deployment":
        template = out["spec"]["template"]
        template["metadata"] = _metadata(template["metadata"])
        annotations = dict(doc["spec"]["template"]["metadata"].get("annotations") or {})
        annotations.pop("checksum/config", None)
        template["metadata"]["annotations"] = annotations
        for container in template["spec"]["containers"]:
            container.pop("imagePullPolicy", None)
            container["image"] = container["image"].rsplit(":", 1)[0]
            container["env"] = sorted(container.get("env", []), key=lambda e: e["name"])
    return out


def differences(kustomized: list[Doc], charted: list[Doc]) -> list[str]:
    """What differs in substance between the two renderings, one line per object; empty when
    they agree."""
    left = {k: substance(d) for k, d in by_key(kustomized).items()}
    right = {k: substance(d) for k, d in by_key(charted).items() if k[0] not in HELM_ONLY_KINDS}
    problems = [
        f"only in kustomize: {k}"
        for k in sorted(left.keys() - right.keys())
        if k[0] not in KUSTOMIZE_ONLY_KINDS
    ]
    problems += [f"only in the chart: {k}" for k in sorted(right.keys() - left.keys())]
    for k in sorted(left.keys() & right.keys()):
        if left[k] != right[k]:
            problems.append(f"{k} differs:\n{_diff(left[k], right[k])}")
    return problems


def _diff(left: Doc, right: Doc) -> str:
    a = yaml.safe_dump(left, sort_keys=True).splitlines()
    b = yaml.safe_dump(right, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "kustomize", "chart", lineterm="", n=2))
