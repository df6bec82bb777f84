"""Proxy credentials in every lease answer: the lease's ``proxy.url`` carries them.

Minted on every answer, never stored: the user name and the password each carry an HMAC over
the lease id, its fencing token and its expiry, under the proxy's key
(``services.providers.squidauth.pure.scheme``), so any replica mints the same one from its view,
and nothing secret reaches the event log. The user name is not the bare lease id, which others
can read: Squid caches a checked credential by user name, and a name others can repeat let their
requests ride on the holder's check (docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md).
A renewal moves the expiry, so the URL of a renewed lease has a new user name and password; the
old ones stop working at the old expiry (docs/api.md;
docs/decisions/0084-leases-enforced-at-the-proxy.md). External proxies are not ours and keep their
URL as declared.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

from events.schemas import ProxyMode
from projections.lease import LeaseRecord
from projections.proxy import ProxyView
from services.providers.squidauth.pure.scheme import (
    Credential,
    expiry_ms,
    lease_credential,
    proxy_key,
)


class LeaseCredentials:
    """Mints a lease's proxy URL with credentials, from the master lease secret."""

    def __init__(self, master: bytes) -> None:
        self._master = master

    def __repr__(self) -> str:
        return "LeaseCredentials(<secret>)"

    def credential(self, record: LeaseRecord) -> Credential:
        key = proxy_key(self._master, record.proxy_uid)
        return lease_credential(
            key, record.lease_id, record.fencing_token, expiry_ms(record.expires_at)
        )

    def url(self, proxy: ProxyView, record: LeaseRecord) -> str:
        """``http://<lease id>.<token>.<expiry>.<mac>:<password>@host:port``; the URL as it is
        when there is none yet, or the proxy is External."""
        if not proxy.url or proxy.spec.mode is ProxyMode.EXTERNAL:
            return proxy.url
        parts = urlsplit(proxy.url)
        host = parts.netloc.rpartition("@")[2]
        user, password = self.credential(record)
        netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
        return urlunsplit(parts._replace(netloc=netloc))
