"""The credential scheme shared by discovery (which mints), the health prober (which probes)
and the Squid helper (which checks): pure, so every side computes it the same way.

- The **master secret** is known to the services only.
- A **proxy key** is ``HMAC-SHA256(master, "proxy|" + proxy uid)``: the one thing an instance
  receives at create. A key opens one proxy, and an instance never learns the master.
- A **lease credential** is user ``<lease id>``, password ``<fencing token>.<expiry ms>.<mac>``
  with ``mac = HMAC-SHA256(proxy key, "lease|<lease id>|<token>|<expiry ms>")`` (hex, 128 bits).
  The token and the expiry travel in clear, so the helper can check both without asking
  anyone; the mac makes them unforgeable. A renewal changes the expiry, hence the password.
- A **probe credential** is user ``egress-probe``, password ``<expiry ms>.<mac>`` over
  ``"probe|<expiry ms>"``: accepted like a lease's, but it neither fences nor is fenced.

``helper.py`` carries its own copy of the checking half (it is shipped to VMs as one file);
``tests/unit/test_lease_credentials.py`` runs it against what this module mints.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime

PROBE_USER = "egress-probe"
MAC_HEX = 32
"""Hex digits of the mac kept in a password: 128 bits."""
MIN_SECRET_BYTES = 16


def proxy_key(master: bytes, proxy_uid: str) -> bytes:
    """The key of one proxy, handed to its instance."""
    return hmac.new(master, f"proxy|{proxy_uid}".encode(), hashlib.sha256).digest()


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()[:MAC_HEX]


def expiry_ms(at: datetime) -> int:
    """Milliseconds since the epoch, rounded down: a credential never outlives its lease."""
    return int(at.timestamp() * 1000)


def lease_password(key: bytes, lease_id: str, fencing_token: int, expires_ms: int) -> str:
    message = f"lease|{lease_id}|{fencing_token}|{expires_ms}"
    return f"{fencing_token}.{expires_ms}.{_mac(key, message)}"


def probe_password(key: bytes, expires_ms: int) -> str:
    return f"{expires_ms}.{_mac(key, f'probe|{expires_ms}')}"


def basic_authorization(user: str, password: str) -> str:
    """A ``Proxy-Authorization`` value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
