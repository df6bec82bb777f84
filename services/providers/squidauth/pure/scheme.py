"""The credential scheme shared by discovery (which mints), the health prober (which probes)
and the Squid helper (which checks): pure, so every side computes it the same way.

- The **master secret** is known to the services only.
- A **proxy key** is ``HMAC-SHA256(master, "proxy|" + proxy uid)``: the one thing an instance
  receives at create. A key opens one proxy, and an instance never learns the master.
- A **lease credential** (docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md) is
  user ``<lease id>.<token>.<expiry ms>.<name mac>``, with
  ``name mac = HMAC-SHA256(proxy key, "lease-user|<lease id>|<token>|<expiry ms>")``, and
  password ``<token>.<expiry ms>.<mac>`` with ``mac = HMAC-SHA256(proxy key,
  "lease|<user>|<token>|<expiry ms>")`` (hex, 128 bits each). Squid caches a checked credential
  by its user name alone, so the user name carries a secret: nobody who has not seen the
  credential can name Squid's cache entry, and the password is bound to the whole user name.
  The token and the expiry travel in clear, so the helper checks both without asking anyone; a
  renewal changes the expiry, hence the whole credential.
- The password is what the scheme before D133 would mint for a lease whose id is the whole user
  name, so an instance still running that helper accepts the credential as it is (D133).
- A **probe credential** is user ``egress-probe.<expiry ms>.<name mac>`` over
  ``"probe-user|<expiry ms>"``, password ``<expiry ms>.<mac>`` over ``"probe|<user>|<expiry
  ms>"``: accepted like a lease's, but it neither fences nor is fenced.

``helper.py`` carries its own copy of the checking half (it is shipped to VMs as one file);
``tests/unit/test_login_scheme.py`` runs it against what this module mints.
"""

from __future__ import annotations

import base64
import hmac
from datetime import datetime
from typing import NamedTuple

PROBE_USER = "egress-probe"
"""The first part of every probe credential's user name."""
MAC_HEX = 32
"""Hex digits of a mac kept in a user name or a password: 128 bits."""
MIN_SECRET_BYTES = 16


class Credential(NamedTuple):
    """A user name and a password, both made of URL-safe characters only (``A-Za-z0-9-._``
    when the lease id is), so every client takes them as they are in a URL."""

    user: str
    password: str


def proxy_key(master: bytes, proxy_uid: str) -> bytes:
    """The key of one proxy, handed to its instance."""
    return hmac.digest(master, f"proxy|{proxy_uid}".encode(), "sha256")


def _mac(key: bytes, message: str) -> str:
    return hmac.digest(key, message.encode(), "sha256").hex()[:MAC_HEX]


def expiry_ms(at: datetime) -> int:
    """Milliseconds since the epoch, rounded down: a credential never outlives its lease."""
    return int(at.timestamp() * 1000)


def lease_credential(key: bytes, lease_id: str, fencing_token: int, expires_ms: int) -> Credential:
    """The credential of one lease at one fencing token until one expiry (the helper refuses a
    lease id with ``|`` in it, which no id discovery makes has)."""
    clear = f"{fencing_token}.{expires_ms}"
    user = f"{lease_id}.{clear}.{_mac(key, f'lease-user|{lease_id}|{fencing_token}|{expires_ms}')}"
    password = f"{clear}.{_mac(key, f'lease|{user}|{fencing_token}|{expires_ms}')}"
    return Credential(user, password)


def probe_credential(key: bytes, expires_ms: int) -> Credential:
    """The prober's credential for the proxy of ``key`` until ``expires_ms``."""
    user = f"{PROBE_USER}.{expires_ms}.{_mac(key, f'probe-user|{expires_ms}')}"
    return Credential(user, f"{expires_ms}.{_mac(key, f'probe|{user}|{expires_ms}')}")


def lease_id_of(user: str) -> str:
    """The part of a user name a log may show: what comes before the first ``.`` (the lease id,
    or ``egress-probe``); never a mac."""
    return user.partition(".")[0]


def basic_authorization(credential: Credential) -> str:
    """A ``Proxy-Authorization`` value."""
    raw = f"{credential.user}:{credential.password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")
