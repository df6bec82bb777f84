"""Proxy and ProxyPool manifests as a user writes them for ``apply -f`` (docs/pools.md), for
the CLI's pool tests: one pool template, so what a test changes is what it names."""

from __future__ import annotations

from pathlib import Path

POOL = """\
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: NAME, namespace: crawl}
spec:
  replicas: 3
  maxAge: 6h
  template:
    provider: local
    attributes: {country: de}
"""
PROXY = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: NAME, namespace: crawl}
spec:
  provider: local
  attributes: {country: COUNTRY}
"""


def pool(name: str = "de", replicas: int = 3) -> str:
    """crawl/``name``: local members with ``country: de``, recycled after 6 hours."""
    return POOL.replace("NAME", name).replace("replicas: 3", f"replicas: {replicas}")


def proxy(name: str, country: str = "de") -> str:
    return PROXY.replace("NAME", name).replace("COUNTRY", country)


def manifest(tmp_path: Path, *documents: str) -> str:
    """A new file under ``tmp_path`` holding ``documents``; its path."""
    path = tmp_path / f"pools-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text("---\n".join(documents))
    return str(path)
