"""The Squid configuration every provider runs: a forward proxy and nothing else.

Pure, so the local and kubernetes providers (and any VM image that wants it) share one answer
to "what does an egress Squid look like": no disk or memory cache (crawlers want fresh pages),
no helpers that would outlive it (pinger), an immediate shutdown, client addresses hidden, and
only the clients allowed may use it.

With ``auth``, only the holder of a current lease may use it too
(docs/decisions/0084-leases-enforced-at-the-proxy.md): the lease helper checks every credential,
Squid trusts a checked one for one second at most, and a request without a valid one is answered 407
before any other rule can allow it. The helpers are started on demand (``startup=0``), so a helper
that dies can never make Squid exit ("crashing too rapidly" is fatal only below the startup count),
and an overloaded helper queue answers ERR instead of ending Squid (D92).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

AUTH_ACL = "egress_lease"


@dataclass(frozen=True, slots=True)
class SquidAuth:
    """How Squid runs the lease helper: ``program`` is the command line (interpreter, script,
    ``--key-file``, ``--state-file``), without ``--concurrent`` and ``--fence-floor``, which are
    added here. ``fence_floor`` is the proxy's highest granted fencing token when this instance
    was created: the helper refuses lower ones from the start (D92)."""

    program: str
    children: int = 4
    concurrency: int = 32
    fence_floor: int = 0


def auth_lines(auth: SquidAuth) -> list[str]:
    """The directives that make every request need a current lease's credentials; they go
    before any ``http_access`` line. A credential is re-checked after ``credentialsttl``, so an
    expired or fenced one is refused within about a second.

    Squid 5 exits ("helpers are crashing too rapidly") when a helper that never answered dies
    while fewer helpers run than ``startup=``; with ``startup=0`` that is never the case, and a
    dead helper is simply replaced by the next request. ``on-persistent-overload=ERR`` answers
    ERR when every helper stays busy for minutes, where the default would end Squid."""
    floor = f" --fence-floor {auth.fence_floor}" if auth.fence_floor > 0 else ""
    return [
        f"auth_param basic program {auth.program}{floor} --concurrent",
        f"auth_param basic children {auth.children} startup=0 idle=1 "
        f"concurrency={auth.concurrency} on-persistent-overload=ERR",
        "auth_param basic realm egress-proxies",
        "auth_param basic credentialsttl 1 second",
        "auth_param basic casesensitive on",
        f"acl {AUTH_ACL} proxy_auth REQUIRED",
        f"http_access deny !{AUTH_ACL}",
    ]


def squid_config(
    *,
    listen: str,
    name: str,
    cache_log: str,
    coredump_dir: str,
    allowed_clients: Sequence[str] = (),
    user: str | None = None,
    auth: SquidAuth | None = None,
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
    if auth is not None:
        lines.extend(auth_lines(auth))
    if allowed_clients:
        lines.append(f"acl egress_clients src {' '.join(allowed_clients)}")
    lines.append("http_access allow localhost")
    if allowed_clients:
        lines.append("http_access allow egress_clients")
    lines.append("http_access deny all")
    if user is not None:
        lines.append(f"cache_effective_user {user}")
    return "\n".join(lines) + "\n"
