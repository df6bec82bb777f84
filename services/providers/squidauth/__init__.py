"""Leases enforced at the proxy: per-proxy keys, credentials, and the Squid helper that checks
them (docs/architecture.md, "Leases at the proxy";
docs/decisions/0084-leases-enforced-at-the-proxy.md)."""
