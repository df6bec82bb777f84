"""A pool as a client names it: ``NAMESPACE/NAME``, or ``NAME`` in the namespace ``default``
(docs/api.md, "Pools").

The discovery API's lease requests, the console's filters and the clients file's allowed
selectors write a pool the same way, and so does every service that authenticates with the
clients file: the grammar lives below the services so each reads it alike
(docs/decisions/0154-the-clients-table-below-the-services.md). Pure: text in, a ``PoolRef`` or a
ValueError naming the rule out.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.customresource import DNS_LABEL
from events.poolresource import MAX_POOL_NAME

DEFAULT_NAMESPACE = "default"
"""The namespace of a ``pool`` written without one: a ProxyPool applied without
``metadata.namespace`` is in it (``events.customresource.ObjectMeta``)."""
MAX_NAMESPACE = 63
MAX_POOL_REF = MAX_NAMESPACE + 1 + MAX_POOL_NAME
SHOWN = 100
"""Characters of a refused value quoted back in a message at most."""
HOW = f"write NAMESPACE/NAME (crawl/de), or NAME for a pool in the namespace {DEFAULT_NAMESPACE}"


@dataclass(frozen=True, slots=True)
class PoolRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_pool_ref(text: str) -> PoolRef:
    """``crawl/de`` -> the pool ``de`` of ``crawl``; ``de`` -> ``default/de``. ValueError, with
    the rule, for anything that cannot name a pool (more than one ``/``, an empty part, a part
    that is no DNS label): the request would otherwise match no proxy and look like a busy pool.
    """
    shown = repr(text[:SHOWN]) + ("..." if len(text) > SHOWN else "")
    namespace, slash, name = text.rpartition("/")
    if not slash:
        namespace = DEFAULT_NAMESPACE
    if "/" in namespace:
        raise ValueError(f"{shown} has more than one '/'; {HOW}")
    if not DNS_LABEL.fullmatch(namespace):
        raise ValueError(
            f"{shown}: the namespace is 1-{MAX_NAMESPACE} lowercase letters, digits or '-'; {HOW}"
        )
    if not DNS_LABEL.fullmatch(name) or len(name) > MAX_POOL_NAME:
        raise ValueError(
            f"{shown}: the name is 1-{MAX_POOL_NAME} lowercase letters, digits or '-'; {HOW}"
        )
    return PoolRef(namespace, name)
