"""The proxy login of D133 (docs/decisions/0133-a-proxy-login-nobody-else-can-repeat.md): what
the scheme mints, checked by the helper's own ``check``, over generated leases and every
one-character change of a credential. Squid caches a checked credential by user name, so the user
name must carry a secret; the password is bound to the whole of it."""

from __future__ import annotations

import hashlib
import hmac
import string
import tempfile
from pathlib import Path
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from services.providers.squidauth import helper
from services.providers.squidauth.pure import scheme
from tests.unit.test_lease_credentials import MASTER, UID

KEY = scheme.proxy_key(MASTER, UID)
NOW = 1_800_000_000_000
UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
"""What RFC 3986 lets a URL's user and password hold unescaped: every client takes these."""

lease_ids = st.one_of(
    st.uuids().map(str),
    st.text(alphabet=string.ascii_letters + string.digits + "-._~", min_size=1, max_size=40),
)
tokens = st.integers(0, 2**63 - 1)
lifetimes = st.integers(1, 10**9)


def checked(user: str, password: str, *, floor: int = 0, now: int = NOW) -> str:
    with tempfile.TemporaryDirectory() as directory:
        fence = helper.Fence(str(Path(directory) / "fence"), floor)
        return helper.check(KEY, fence, user, password, now)


def legacy_check(key: bytes, user: str, password: str) -> bool:
    """The mac check of the helper before D133 (user the lease id, password
    ``<token>.<expiry>.<mac over "lease|<user>|<token>|<expiry>">``), which instances created
    before it still run."""
    parts = password.split(".")
    if len(parts) != 3 or not user or "|" in user:
        return False
    message = f"lease|{user}|{parts[0]}|{parts[1]}".encode()
    mac = hmac.new(key, message, hashlib.sha256).hexdigest()[:32]
    return hmac.compare_digest(mac, parts[2])


@settings(max_examples=200)
@given(lease_id=lease_ids, token=tokens, lifetime=lifetimes)
def test_a_minted_lease_credential_passes_and_is_url_safe(
    lease_id: str, token: int, lifetime: int
) -> None:
    user, password = scheme.lease_credential(KEY, lease_id, token, NOW + lifetime)
    assert checked(user, password, floor=token) == "OK"
    assert password
    assert UNRESERVED.issuperset(user)
    assert UNRESERVED.issuperset(password)
    assert quote(user, safe="") == user
    assert quote(password, safe="") == password
    assert scheme.lease_id_of(user) == lease_id.partition(".")[0]


@settings(max_examples=200)
@given(
    lease=st.tuples(lease_ids, tokens, lifetimes),
    in_user=st.booleans(),
    where=st.integers(0, 10**4),
    char=st.sampled_from(sorted(UNRESERVED)),
)
def test_any_one_character_changed_is_refused(
    lease: tuple[str, int, int], in_user: bool, where: int, char: str
) -> None:
    lease_id, token, lifetime = lease
    user, password = scheme.lease_credential(KEY, lease_id, token, NOW + lifetime)
    text = user if in_user else password
    at = where % len(text)
    changed = text[:at] + char + text[at + 1 :]
    if changed == text:
        return
    forged = (changed, password) if in_user else (user, changed)
    assert checked(*forged).startswith("ERR"), forged


@settings(max_examples=100)
@given(lease_id=lease_ids, token=tokens, password=st.text(string.printable, max_size=80))
def test_the_right_user_name_with_any_other_password_is_refused(
    lease_id: str, token: int, password: str
) -> None:
    user, right = scheme.lease_credential(KEY, lease_id, token, NOW + 60_000)
    if password != right:
        assert checked(user, password).startswith("ERR")


@settings(max_examples=100)
@given(lease_id=st.uuids().map(str), token=tokens, lifetime=lifetimes)
def test_the_helper_before_d133_accepts_the_new_lease_credential(
    lease_id: str, token: int, lifetime: int
) -> None:
    user, password = scheme.lease_credential(KEY, lease_id, token, NOW + lifetime)
    assert legacy_check(KEY, user, password)
    assert not legacy_check(scheme.proxy_key(MASTER, UID + "x"), user, password)


def test_a_credential_in_the_form_before_d133_is_refused() -> None:
    message = f"lease|lease-1|7|{NOW + 60_000}".encode()
    mac = hmac.new(KEY, message, hashlib.sha256).hexdigest()[:32]
    assert checked("lease-1", f"7.{NOW + 60_000}.{mac}").startswith("ERR")
    probe = hmac.new(KEY, f"probe|{NOW + 60_000}".encode(), hashlib.sha256).hexdigest()[:32]
    assert checked(scheme.PROBE_USER, f"{NOW + 60_000}.{probe}").startswith("ERR")


def test_the_probe_credential_passes_below_any_fence_and_is_bound_like_a_lease() -> None:
    user, password = scheme.probe_credential(KEY, NOW + 300_000)
    assert user.startswith(f"{scheme.PROBE_USER}.")
    assert checked(user, password, floor=10**6) == "OK"
    assert checked(user, "x").startswith("ERR")
    assert checked(scheme.PROBE_USER, password).startswith("ERR")
    assert checked(user, password, now=NOW + 300_000) == 'ERR message="lease expired"'
    other_user, _ = scheme.probe_credential(KEY, NOW + 300_001)
    assert checked(other_user, password).startswith("ERR")
    assert UNRESERVED.issuperset(user + password)


def test_a_lease_credential_is_not_a_probe_credential_nor_the_reverse() -> None:
    """The two macs of each are over messages of their own kind: neither half of one verifies
    as the other."""
    expires = NOW + 60_000
    probe_user, probe_password = scheme.probe_credential(KEY, expires)
    lease_user, lease_password = scheme.lease_credential(KEY, scheme.PROBE_USER, 1, expires)
    assert checked(probe_user, lease_password).startswith("ERR")
    assert checked(lease_user, probe_password).startswith("ERR")
    assert checked(lease_user, lease_password) == "OK"  # a lease id may be any name
