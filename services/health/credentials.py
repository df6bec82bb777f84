"""The prober's own credential for proxies that enforce leases
(docs/decisions/0084-leases-enforced-at-the-proxy.md).

A proxy that enforces leases answers 407 to a request without a current lease's credentials, and
the prober holds no lease. It sends the probe credential instead: a user name
``egress-probe.<expiry>.<mac>`` and a password bound to it, minted with the proxy's key from the
master lease secret, valid for a few minutes (a fixed user name would let others' requests ride
on the probe's check in Squid's cache:
docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md). The helper accepts it like a
lease's but it neither fences a lease nor is fenced by one, so probing never locks a holder out.

The probe client knows a proxy by its URL; the key is the proxy's uid's. So this finds the uid of
a URL in the shared proxy view, through an index rebuilt only when a URL is not in it (a new or
replaced instance; at most every few seconds for a URL no view has): one pass over the views per
change, not per probe. External proxies are not ours and get no credential.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from events.schemas import ProxyMode
from projections.proxy import ProxyView, probe_target
from services.providers.squidauth.pure.scheme import (
    basic_authorization,
    probe_credential,
    proxy_key,
)

LIFETIME_SECONDS = 300.0
"""How long one probe credential is valid: longer than any probe takes, short enough that one
seen on the wire is soon worthless. A proxy's clock may be this far behind ours."""


REBUILD_SECONDS = 5.0
"""A URL that no view has is looked for again at most this often."""


class ProbeCredentials:
    """``credentials(proxy_url)``: the ``Proxy-Authorization`` value for a probe, or ``""``."""

    def __init__(
        self,
        master: bytes,
        views: Callable[[], Mapping[str, ProxyView]],
        *,
        lifetime: float = LIFETIME_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._master = master
        self._views = views
        self._lifetime = lifetime
        self._clock = clock
        self._uids: dict[str, str] = {}
        self._missing: dict[str, float] = {}

    def __repr__(self) -> str:
        return "ProbeCredentials(<secret>)"

    def __call__(self, proxy_url: str) -> str:
        uid = self._uid(proxy_url)
        if uid is None:
            return ""
        expires = int((self._clock() + self._lifetime) * 1000)
        return basic_authorization(probe_credential(proxy_key(self._master, uid), expires))

    def _uid(self, proxy_url: str) -> str | None:
        views = self._views()
        uid = self._uids.get(proxy_url)
        if uid is not None:
            view = views.get(uid)
            if view is not None and proxy_url in (view.url, probe_target(view)[1]):
                return uid
        now = self._clock()
        if now - self._missing.get(proxy_url, float("-inf")) < REBUILD_SECONDS:
            return None  # an External proxy's URL: not worth a pass per probe
        self._uids = {
            url: view.uid
            for view in views.values()
            if view.spec.mode is not ProxyMode.EXTERNAL and not view.removed
            # A rotation's replacement is probed before it serves (D85): same uid, same key.
            for url in {view.url, probe_target(view)[1]}
            if url
        }
        found = self._uids.get(proxy_url)
        if found is None:
            self._missing = {u: t for u, t in self._missing.items() if now - t < REBUILD_SECONDS}
            self._missing[proxy_url] = now
        return found
