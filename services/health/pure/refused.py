"""A check URL the proxy's own destination rules refuse, told apart from a dead proxy (D134).

Every provider's Squid refuses link-local, metadata, private and loopback destinations and
CONNECT beyond port 443 unless its entry's ``allowedTargets`` lists them; the health and egress
checks go through the proxy and obey the same rules. A check URL on an intranet is then
answered 403 by a perfectly working proxy, and "HTTP 403" alone would send an operator looking
for a broken proxy or a site that blocks it. Squid marks its own refusal: its answer to a
CONNECT is the proxy's by definition, and its error page for a plain request names the error
(``<!-- ERR_ACCESS_DENIED -->``), which no site sends. Pure: the caller fetched the answer.
"""

from __future__ import annotations

SQUID_DENIED = b"ERR_ACCESS_DENIED"
PAGE_LIMIT = 16 * 1024
"""Squid's error pages are about 4 KiB; the marker is in the footer."""


def refused_by_proxy(outcome: str, status: int, body: bytes = b"", detail: str = "") -> bool:
    """Whether a failure is the proxy's rules refusing the URL: a ``CONNECT`` answered 403
    (``tunnel_refused``, whose status is only in ``detail``, "CONNECT host:port: HTTP 403"),
    or a 403 page carrying Squid's marker."""
    if outcome == "tunnel_refused":
        return detail.endswith(": HTTP 403")
    return status == 403 and SQUID_DENIED in body


def refused_message(detail: str, url: str, fix: str) -> str:
    """What an operator reads: the URL, why, and the two fixes (``fix`` names the setting that
    changes the URL)."""
    return (
        f"{detail}: the proxy's own destination rules refuse {url} (Squid answered 403 "
        "ERR_ACCESS_DENIED; a proxy reaches public addresses, CONNECT to port 443, and what its "
        "provider entry's allowedTargets lists: docs/providers.md); the proxy itself may be "
        f"fine: list the URL's range and port in allowedTargets, or set {fix} to a public URL"
    )
