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

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from services.providers.pure.targets import AllowedTarget, header_lines, target_lines

AUTH_ACL = "egress_lease"
METER_FORMAT = "egress_meter"
METER_FIELDS = "%ts.%03tu %>st %<st %Ss %note{lease}"
"""One line per request or tunnel, when it ends: when, bytes received from the client, bytes
sent to it, Squid's result code, and the lease the helper named (``-`` for none). The note is
last, so a value with a space could only add fields, which the meter refuses
(docs/decisions/0161-metering-upstream-bytes.md)."""


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


@dataclass(frozen=True, slots=True)
class Parent:
    """A proxy every request and CONNECT is chained to, logging in as ``username`` with
    ``password`` (a proxy service's gateway, docs/decisions/0160-upstream-proxy-services.md).
    ``host`` is a host name or an IP literal, checked by ``parent_lines``. Kept out of ``repr``:
    the login is the account's secret."""

    host: str
    port: int
    username: str = field(repr=False)
    password: str = field(repr=False)


_HOST_NAME = re.compile(
    r"^(?=.{1,253}\Z)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z"
)


def parent_host(text: str) -> str:
    """``text`` as a ``cache_peer`` host (a DNS name, or an IP literal without brackets), or
    ValueError saying why not: anything else would be another word on Squid's line."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not _HOST_NAME.match(text):
        raise ValueError(f"{text[:64]!r} is not a host name or an IP address")
    return text


def peer_login(username: str, password: str) -> str:
    """The ``login=`` value of a ``cache_peer``: Squid URL-decodes it once (``%XX``) and sends
    it as the peer's Basic credentials, so every byte but letters, digits and ``-._~`` is
    escaped: a space, a ``%``, a ``#`` or a ``$`` in a password reaches the service as written
    and never splits, comments or expands the line. A user name with ``:`` or starting with
    ``*``, or empty, is refused: Squid would send another login (``*`` passes the client's)."""
    if not username or ":" in username or username.startswith("*"):
        raise ValueError("a parent's user name must be non-empty, without ':' or a leading '*'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in username + password):
        raise ValueError("a parent's login cannot hold control characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in username + password):
        raise ValueError("a parent's login must be UTF-8 text (it holds a lone surrogate)")
    return f"{quote(username, safe='')}:{quote(password, safe='')}"


def parent_lines(parent: Parent) -> list[str]:
    """Every request goes to ``parent``, none directly: the service is the egress. The peer
    is asked nothing else (no ICP, no digest), and its login replaces the client's (ours)."""
    if not 1 <= parent.port <= 65535:
        raise ValueError(f"parent port {parent.port} is not a port")
    host = parent_host(parent.host)
    login = peer_login(parent.username, parent.password)
    return [
        f"cache_peer {host} parent {parent.port} 0 no-query no-digest no-netdb-exchange "
        f"default name=egress_upstream login={login}",
        "never_direct allow all",
    ]


def outgoing_address(text: str) -> str:
    """``text`` as Squid's ``tcp_outgoing_address`` value (the canonical form of an IPv4 or IPv6
    literal), or ValueError saying why it cannot be one: Squid binds to an address, so a host
    name, an interface name, a network, a scoped IPv6 address, or an address that no host can
    send from (unspecified, multicast, broadcast) is refused, not guessed at."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not an IP address; use an IPv4 or IPv6 literal this host owns, "
            "e.g. 192.0.2.10 or 2001:db8::10 (not a host or interface name, no brackets, "
            "no /prefix)"
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise ValueError(f"{text!r} has a scope (%zone); Squid takes the address without one")
    if address.is_unspecified:
        raise ValueError(f"{text!r} is the unspecified address; leave the field out instead")
    if address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{text!r} is not a unicast address; no connection can come from it")
    return str(address)


def meter_log_lines(path: str) -> list[str]:
    """The access log an upstream instance's meter reads (D161): written line by line
    (``buffered_logs off``), never renamed by Squid itself (``logfile_rotate 0``: on ``SIGUSR1``
    Squid only reopens it, after the meter has moved it aside). ``path`` must be absolute and
    one word: anything else would be another word on Squid's line."""
    if not path.startswith("/") or any(c.isspace() or ord(c) < 0x20 for c in path):
        raise ValueError(f"access log {path[:64]!r}: an absolute path without spaces is needed")
    return [
        f"logformat {METER_FORMAT} {METER_FIELDS}",
        f"access_log stdio:{path} logformat={METER_FORMAT}",
        "logfile_rotate 0",
        "buffered_logs off",
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
    outgoing: str = "",
    include: str = "",
    pid_file: str = "none",
    targets: Sequence[AllowedTarget] = (),
    loopback_http: bool = False,
    own_addresses_file: str = "",
    parent: Parent | None = None,
    access_log: str = "",
) -> str:
    """``listen`` is squid's ``http_port`` value (``3128`` or ``127.0.0.1:20001``);
    ``pid_file``: none for a Squid we run ourselves, the service manager's path on a VM;
    ``include``, a file glob, is read before the access rules (a VM's ``conf.d``, where the
    lease part puts its ``deny``, so that it precedes every ``allow``);
    ``outgoing``, an IP literal (see ``outgoing_address``), is the source of every
    connection Squid opens to a target (``tcp_outgoing_address``), or "" for the host's choice.
    Squid uses it only for targets of the same address family.

    Where a request may go (D134, ``targets.py``): public addresses, CONNECT to 443 only, plus
    ``targets``; ``loopback_http`` adds plain HTTP to loopback (the local provider's sites),
    ``own_addresses_file`` refuses the host's own addresses (a VM's, found at boot). These
    rules come before ``include``, so nothing included can allow what they refuse.
    ``parent``: every request is chained to it (``parent_lines``), none goes directly.
    ``access_log``: the meter's log at that path (``meter_log_lines``), else none is kept."""
    lines = [
        f"http_port {listen}",
        f"visible_hostname egress-{name}",
        f"pid_filename {pid_file}",
        "cache deny all",
        "cache_mem 0 MB",
        *(meter_log_lines(access_log) if access_log else ["access_log none"]),
        "cache_store_log none",
        f"cache_log {cache_log}",
        f"coredump_dir {coredump_dir}",
        "netdb_filename none",
        "pinger_enable off",
        "digest_generation off",
        "shutdown_lifetime 0 seconds",
        *header_lines(),
    ]
    if auth is not None:
        lines.extend(auth_lines(auth))
    lines += target_lines(
        targets, loopback_http=loopback_http, own_addresses_file=own_addresses_file
    )
    if include:
        lines.append(f"include {include}")
    if allowed_clients:
        lines.append(f"acl egress_clients src {' '.join(allowed_clients)}")
    lines.append("http_access allow localhost")
    if allowed_clients:
        lines.append("http_access allow egress_clients")
    lines.append("http_access deny all")
    if outgoing:
        lines.append(f"tcp_outgoing_address {outgoing_address(outgoing)}")
    if parent is not None:
        lines.extend(parent_lines(parent))
    if user is not None:
        lines.append(f"cache_effective_user {user}")
    return "\n".join(lines) + "\n"
