"""Pure translations between our contract and Kubernetes pods: names, labels, manifest, states.

Kubernetes label keys are our own group's (``crawl.example.com/...``), like the CRD's finalizer
and the cloud-init label; ``Instance.labels`` maps them back to the contract's keys, so GC and
the contract suite see the same keys for every provider.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from datetime import UTC, datetime
from typing import Any

from events.schemas import InstanceState
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
)
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.pure.squidconf import SquidAuth
from services.providers.pure.squidconf import squid_config as shared_squid_config

GROUP = "crawl.example.com"
K8S_MANAGED = f"{GROUP}/managed"
K8S_OWNER = f"{GROUP}/owner-uid"
K8S_PROVIDER = f"{GROUP}/provider"
K8S_PROXY = f"{GROUP}/proxy"
CREATED_AT_ANNOTATION = f"{GROUP}/created-at"
INSTANCE_NAME_ANNOTATION = f"{GROUP}/instance-name"
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
CONTAINER = "squid"

TO_OURS = {K8S_MANAGED: MANAGED_LABEL, K8S_OWNER: OWNER_LABEL}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")


def pod_name(instance_name: str) -> str:
    """A DNS-1123 label for ``instance_name``: itself when it is one (the reconciler's names
    are), else a cleaned prefix plus a hash of the original, so two names never share a pod."""
    if _DNS_LABEL.match(instance_name):
        return instance_name
    cleaned = re.sub(r"[^a-z0-9-]+", "-", instance_name.lower()).strip("-")[:52].strip("-")
    digest = hashlib.sha256(instance_name.encode()).hexdigest()[:10]
    return f"{cleaned or 'px'}-{digest}"


def label_value(value: str) -> str:
    """``value`` when Kubernetes accepts it as a label value, else a stable hash of it."""
    if _LABEL_VALUE.match(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def provider_id(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_provider_id(value: str) -> tuple[str, str] | None:
    """``(namespace, pod name)``, or None for an id this provider can never have issued."""
    namespace, sep, name = value.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _DNS_LABEL.match(name):
        return None
    return namespace, name


def selector(provider_name: str) -> str:
    """Our pods, of this named provider (two named kubernetes providers share a cluster)."""
    return f"{K8S_MANAGED}=true,{K8S_PROVIDER}={label_value(provider_name)}"


# With leases enforced (D84) the helper, the proxy key and the helper's fencing state live on
# an emptyDir: it outlives a restart of the container, so a restarted Squid still refuses the
# leases it had fenced.
LEASE_DIR = "/var/lib/egress-lease"
LEASE_VOLUME = "egress-lease"
LEASE_AUTH = SquidAuth(
    program=f"/usr/bin/env python3 {LEASE_DIR}/lease-auth.py --key-file {LEASE_DIR}/lease.key "
    f"--state-file {LEASE_DIR}/fence"
)


def squid_config(
    config: KubernetesConfig, name: str, *, lease_auth: bool = False, fence_floor: int = 0
) -> str:
    """The shared egress Squid, listening on the pod's port for ``allowedClients`` only (and,
    with ``lease_auth``, for the holder of a current lease only, none below ``fence_floor``:
    docs/decisions/0092-nobody-who-reaches-a-proxy.md)."""
    return shared_squid_config(
        listen=str(config.port),
        name=name,
        cache_log="/dev/stderr",
        coredump_dir="/tmp",
        allowed_clients=config.allowed_clients,
        targets=config.allowed_targets,
        auth=dataclasses.replace(LEASE_AUTH, fence_floor=fence_floor) if lease_auth else None,
    )


# The image's own entrypoint expects a config file; ours arrives in the environment, so the
# pod needs no ConfigMap (and the provider no RBAC to write one).
_COMMAND = 'printf "%s" "$SQUID_CONF" > /tmp/squid.conf && exec squid -N -f /tmp/squid.conf'
# The same, after writing the lease helper and key (the key readable by Squid's user only).
_LEASE_COMMAND = (
    "command -v python3 >/dev/null || { echo 'egress-proxies: this proxy enforces leases and "
    "its helper needs python3, which the image lacks; use an image with squid and python3, "
    "or give the provider auth: none' >&2; exit 1; }; "
    f'd={LEASE_DIR} && printf "%s" "$EGRESS_LEASE_HELPER" > "$d/lease-auth.py" && '
    '(umask 077 && printf "%s\n" "$EGRESS_LEASE_KEY" > "$d/lease.key") && '
    '{ [ "$(id -u)" != 0 ] || chown proxy "$d/lease.key" "$d" 2>/dev/null || '
    'chown squid "$d/lease.key" "$d" 2>/dev/null || true; } && '
    "unset EGRESS_LEASE_KEY EGRESS_LEASE_HELPER && " + _COMMAND
)


def build_pod(
    request: CreateRequest, config: KubernetesConfig, provider_name: str, now: datetime
) -> dict[str, Any]:
    name = pod_name(request.name)
    labels = {
        K8S_MANAGED: "true",
        K8S_OWNER: label_value(request.owner_uid),
        K8S_PROVIDER: label_value(provider_name),
        "app.kubernetes.io/name": "squid",
        "app.kubernetes.io/component": "egress-proxy",
        "app.kubernetes.io/managed-by": "egress-proxies",
    }
    if request.proxy_name:
        labels[K8S_PROXY] = label_value(request.proxy_name)
    resources: dict[str, dict[str, str]] = {}
    if config.cpu_request or config.memory_request:
        requests = {"cpu": config.cpu_request, "memory": config.memory_request}
        resources["requests"] = {k: v for k, v in requests.items() if v}
    if config.memory_limit:
        resources["limits"] = {"memory": config.memory_limit}
    auth = request.lease_auth
    floor = auth.fence_floor if auth else 0
    conf = squid_config(config, name, lease_auth=bool(auth), fence_floor=floor)
    env = [{"name": "SQUID_CONF", "value": conf}]
    if auth is not None:
        env += [
            {"name": "EGRESS_LEASE_KEY", "value": auth.key},
            {"name": "EGRESS_LEASE_HELPER", "value": auth.helper},
        ]
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": config.delete_grace_seconds,
        "containers": [
            {
                "name": CONTAINER,
                "image": config.image,
                "command": ["/bin/sh", "-c", _LEASE_COMMAND if auth else _COMMAND],
                "env": env,
                "ports": [{"name": "proxy", "containerPort": config.port, "protocol": "TCP"}],
                "readinessProbe": {
                    "tcpSocket": {"port": config.port},
                    "periodSeconds": 2,
                    "failureThreshold": 2,
                },
                "resources": resources,
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
    }
    if auth is not None:
        spec["volumes"] = [{"name": LEASE_VOLUME, "emptyDir": {}}]
        spec["containers"][0]["volumeMounts"] = [{"name": LEASE_VOLUME, "mountPath": LEASE_DIR}]
    if config.node_selector:
        spec["nodeSelector"] = dict(config.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": request.namespace or "default",
            "labels": labels,
            "annotations": {
                CREATED_AT_ANNOTATION: now.astimezone(UTC).isoformat(),
                INSTANCE_NAME_ANNOTATION: request.name,
                # The label holds it too, hashed if it is no label value; this is the original.
                K8S_OWNER: request.owner_uid,
                SPEC_HASH_ANNOTATION: request.spec_hash,
            },
        },
        "spec": spec,
    }


def state_of(pod: dict[str, Any]) -> InstanceState:
    """Running only with an address and a passing readiness probe (Squid listening): no
    address, no proxy URL. A pod being deleted is Terminating whatever its phase says."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return InstanceState.TERMINATING
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase == "Running":
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if status.get("podIP") and (ready is None or ready.get("status") == "True"):
            return InstanceState.RUNNING
        return InstanceState.PENDING
    if phase == "Pending":
        return InstanceState.PENDING
    if phase in ("Succeeded", "Failed"):
        return InstanceState.STOPPED
    return InstanceState.UNKNOWN


def parse_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def instance_of(pod: dict[str, Any], port: int, now: datetime) -> Instance:
    """The contract's view of a pod (a dict as the API returns it, camelCase keys). ``now``
    stands in for a creation time the pod does not carry yet (the API sets it on admission),
    passed in so this mapping reads no clock."""
    meta = pod.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    created = parse_time(annotations.get(CREATED_AT_ANNOTATION)) or parse_time(
        meta.get("creationTimestamp")
    )
    owner = annotations.get(K8S_OWNER) or labels.get(K8S_OWNER, "")
    ours = {TO_OURS.get(key, key): value for key, value in labels.items()}
    ours[OWNER_LABEL] = owner
    if created is not None:
        ours[CREATED_AT_LABEL] = created.isoformat()
    status = pod.get("status") or {}
    state = state_of(pod)
    return Instance(
        provider_id=provider_id(meta.get("namespace", ""), meta.get("name", "")),
        name=annotations.get(INSTANCE_NAME_ANNOTATION) or meta.get("name", ""),
        state=state,
        owner_uid=owner,
        created_at=created or now,
        ip=str(status.get("podIP") or "") if state is InstanceState.RUNNING else "",
        port=port,
        instance_uid=str(meta.get("uid") or ""),
        labels=ours,
    )
