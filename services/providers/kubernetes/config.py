"""The ``kubernetes:`` block of a providers-config entry, validated when the file is read.

```yaml
providers:
  - name: k8s
    type: kubernetes
    kubernetes:
      image: ubuntu/squid:6.6-24.04_edge   # the default
      kubeconfig: ""        # empty: in-cluster credentials (or ~/.kube/config outside a pod)
      context: ""
      port: 3128
      allowedClients: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7]
      cpuRequest: 50m
      memoryRequest: 64Mi
      memoryLimit: 256Mi
      nodeSelector: {}
      allowedTargets: []    # non-public ranges the proxies may reach, e.g.
                            # [{cidr: 10.20.0.0/16, ports: [80, 443]}] (D134)
```

Each check names the field and the fix, so a typo stops start-up instead of failing every create.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

import msgspec

from services.providers.pure.targets import AllowedTarget, targets_problem

DEFAULT_IMAGE = "ubuntu/squid:6.6-24.04_edge"
# Who may use the proxies: cluster-internal addresses (pods, nodes), never the whole internet.
DEFAULT_CLIENTS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?\Z")
_IMAGE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._/:@-]*\Z")
_LABEL_KEY = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?\Z")


class KubernetesConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Settings of one named kubernetes provider."""

    image: str = DEFAULT_IMAGE
    kubeconfig: str = ""
    context: str = ""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 3128
    allowed_clients: tuple[str, ...] = DEFAULT_CLIENTS
    cpu_request: str = "50m"
    memory_request: str = "64Mi"
    memory_limit: str = "256Mi"
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    delete_grace_seconds: Annotated[int, msgspec.Meta(ge=0, le=300)] = 5
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    allowed_targets: tuple[AllowedTarget, ...] = ()
    """Non-public ranges and ports the proxies may reach (D134): none by default, so a pod's
    proxy reaches neither the cluster's services nor its node's metadata service."""

    def __post_init__(self) -> None:
        problem = validate(self)
        if problem:
            raise ValueError(problem)


def validate(config: KubernetesConfig) -> str:
    """The first problem with ``config``, or ``""``."""
    if not _IMAGE.match(config.image):
        return f"image {config.image!r} is not an image reference; e.g. {DEFAULT_IMAGE}"
    if config.context and not config.kubeconfig:
        return "context needs kubeconfig: in a pod the in-cluster credentials have no contexts"
    if not config.allowed_clients:
        return "allowedClients is empty: nobody could use the proxies; list client CIDRs"
    for cidr in config.allowed_clients:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            return f"allowedClients: {cidr!r} is not a CIDR; use e.g. 10.0.0.0/8"
    for field, value in (
        ("cpuRequest", config.cpu_request),
        ("memoryRequest", config.memory_request),
        ("memoryLimit", config.memory_limit),
    ):
        if value and not _QUANTITY.match(value):
            return f"{field} {value!r} is not a Kubernetes quantity; use e.g. 50m, 64Mi or 1"
    for key in config.node_selector:
        if not _LABEL_KEY.match(key):
            return f"nodeSelector: {key!r} is not a label key; use e.g. kubernetes.io/arch"
    return targets_problem(config.allowed_targets)
