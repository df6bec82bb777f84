"""Leases enforced by the local provider's other backend, proxy.py (for hosts without Squid).

A proxy.py plugin doing what the Squid helper does, with the helper's own checks (``helper.check``
and its fencing file), so both backends accept and refuse the same credentials. proxy.py asks on
every request, so there is nothing to expire. The key and the fencing state are the instance
directory's (proxy.py's ``--data-dir``), where ``local_process.prepare`` put them. proxy.py
itself drops ``Proxy-Authorization`` before forwarding, so no credential reaches a target.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
from functools import cache

from proxy.http.exception import ProxyAuthenticationFailed
from proxy.http.parser import HttpParser
from proxy.http.proxy import HttpProxyBasePlugin

from services.providers.local_auth import FENCE_FILE, KEY_FILE
from services.providers.squidauth.helper import Fence, check, read_key

_HEADER = b"proxy-authorization"


@cache
def _key(path: str) -> bytes | None:
    return read_key(path)


class LeaseAuthPlugin(HttpProxyBasePlugin):
    """Answers 407 unless the request carries a current lease's (or the probe's) credentials."""

    def before_upstream_connection(self, request: HttpParser) -> HttpParser | None:
        self._check(request)
        return request

    def handle_client_request(self, request: HttpParser) -> HttpParser | None:
        self._check(request)  # every request of a kept-alive connection, not just the first
        return request

    def _check(self, request: HttpParser) -> None:
        directory = str(self.flags.data_dir)
        key = _key(os.path.join(directory, KEY_FILE))
        if key is None or not request.has_header(_HEADER):
            raise ProxyAuthenticationFailed()
        kind, _, encoded = request.header(_HEADER).decode("latin-1").partition(" ")
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ProxyAuthenticationFailed() from None
        user, _, password = decoded.partition(":")
        fence = Fence(os.path.join(directory, FENCE_FILE))
        now_ms = time.time_ns() // 10**6
        if kind.lower() != "basic" or check(key, fence, user, password, now_ms) != "OK":
            raise ProxyAuthenticationFailed()
