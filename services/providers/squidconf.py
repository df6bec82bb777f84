"""The Squid configuration every provider runs: a forward proxy and nothing else.

Pure, so the local and kubernetes providers (and any VM image that wants it) share one answer
to "what does an egress Squid look like": no disk or memory cache (crawlers want fresh pages),
no helpers that would outlive it (pinger), an immediate shutdown, client addresses hidden, and
only the clients allowed may use it.
"""

from __future__ import annotations

from collections.abc import Sequence


def squid_config(
    *,
    listen: str,
    name: str,
    cache_log: str,
    coredump_dir: str,
    allowed_clients: Sequence[str] = (),
    user: str | None = None,
) -> str:
    """``listen`` is squid's ``http_port`` value (``3128`` or ``127.0.0.1:20001``)."""
    lines = [
        f"http_port {listen}",
        f"visible_hostname egress-{name}",
        "pid_filename none",
        "cache deny all",
        "cache_mem 0 MB",
        "access_log none",
        "cache_store_log none",
        f"cache_log {cache_log}",
        f"coredump_dir {coredump_dir}",
        "netdb_filename none",
        "pinger_enable off",
        "digest_generation off",
        "shutdown_lifetime 0 seconds",
        "forwarded_for delete",
        "via off",
    ]
    if allowed_clients:
        lines.append(f"acl egress_clients src {' '.join(allowed_clients)}")
    lines.append("http_access allow localhost")
    if allowed_clients:
        lines.append("http_access allow egress_clients")
    lines.append("http_access deny all")
    if user is not None:
        lines.append(f"cache_effective_user {user}")
    return "\n".join(lines) + "\n"
