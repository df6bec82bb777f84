"""Leases enforced at the proxy: per-proxy keys, credentials, and the Squid helper that checks
them (docs/architecture.md, "Leases at the proxy"; docs/decisions.md, D84)."""
