"""Lease credentials (D84): what discovery and the prober mint. What the Squid helper makes of
them is tested with the helper as a subprocess (tests/integration/test_lease_helper.py)."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote, urlsplit

from events.schemas import ProxyMode, ProxySpec
from projections.lease import LeaseRecord
from projections.proxy import ProxyView, Replacement
from services.discovery.leasing.credentials import LeaseCredentials
from services.health.credentials import ProbeCredentials
from services.providers.squidauth.pure import scheme

MASTER = b"unit-test-master-secret-0123456789"
UID = "9b2f8a4e-0000-4000-8000-000000000001"
FUTURE = datetime.now(UTC) + timedelta(hours=1)


def record(token: int, expires_at: datetime = FUTURE, lease_id: str = "") -> LeaseRecord:
    return LeaseRecord(
        lease_id=lease_id or str(uuid.uuid4()),
        proxy_uid=UID,
        acquired_at=datetime.now(UTC),
        expires_at=expires_at,
        ttl_seconds=60,
        fencing_token=token,
    )


def view(url: str = "http://192.0.2.7:3128", **kw: object) -> ProxyView:
    return ProxyView(uid=UID, url=url, **kw)  # type: ignore[arg-type]


def user_password(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    assert parts.username is not None
    assert parts.password is not None
    return unquote(parts.username), unquote(parts.password)


# ---------------------------------------------------------------------------- minting


def test_each_proxy_has_its_own_key() -> None:
    assert scheme.proxy_key(MASTER, UID) == scheme.proxy_key(MASTER, UID)
    assert scheme.proxy_key(MASTER, UID) != scheme.proxy_key(MASTER, UID + "x")
    assert scheme.proxy_key(MASTER, UID) != scheme.proxy_key(MASTER + b"x", UID)


def test_the_lease_url_user_carries_a_mac_and_the_password_is_bound_to_it() -> None:
    lease = record(42)
    url = LeaseCredentials(MASTER).url(view(), lease)
    user, password = user_password(url)
    lease_id, token, expires, name_mac = user.rsplit(".", 3)
    assert lease_id == lease.lease_id
    assert (int(token), int(expires)) == (42, scheme.expiry_ms(lease.expires_at))
    assert len(name_mac) == scheme.MAC_HEX
    assert password.rpartition(".")[0] == f"{token}.{expires}"
    assert len(password.rpartition(".")[2]) == scheme.MAC_HEX
    assert name_mac not in password
    assert urlsplit(url).username == user  # URL-safe as it is: nothing to escape
    assert urlsplit(url).password == password
    assert urlsplit(url).netloc.endswith("@192.0.2.7:3128")
    assert MASTER.decode() not in url
    assert scheme.proxy_key(MASTER, UID).hex() not in url


def test_a_renewal_changes_the_user_name_and_the_password() -> None:
    lease = record(42)
    renewed = record(42, FUTURE + timedelta(minutes=5), lease_id=lease.lease_id)
    credentials = LeaseCredentials(MASTER)
    assert credentials.url(view(), lease) == credentials.url(view(), lease)
    before = user_password(credentials.url(view(), lease))
    after = user_password(credentials.url(view(), renewed))
    assert before[0] != after[0]
    assert before[1] != after[1]


def test_urls_without_an_address_or_of_external_proxies_stay_as_they_are() -> None:
    credentials = LeaseCredentials(MASTER)
    assert credentials.url(view(url=""), record(1)) == ""
    external = view(
        url="http://them:theirs@proxy.example:3128", spec=ProxySpec(mode=ProxyMode.EXTERNAL)
    )
    assert credentials.url(external, record(1)) == external.url
    assert MASTER.decode() not in repr(credentials)


# ------------------------------------------------------------------------ probe index


def test_the_probe_credential_follows_a_proxy_to_its_new_url() -> None:
    views = {UID: view()}
    now = [1000.0]
    probes = ProbeCredentials(MASTER, lambda: views, clock=lambda: now[0])
    first = probes("http://192.0.2.7:3128")
    assert first.startswith("Basic ")
    user = base64.b64decode(first.removeprefix("Basic ")).decode().partition(":")[0]
    assert user.startswith(f"{scheme.PROBE_USER}.")  # never the fixed name alone (D133)
    assert probes("http://192.0.2.99:3128") == ""  # nobody's
    views[UID] = view(url="http://192.0.2.99:3128")  # replaced: a new address
    assert probes("http://192.0.2.7:3128") == ""
    now[0] += 10  # past the pause for URLs no view has
    assert probes("http://192.0.2.99:3128").startswith("Basic ")
    external = ProxyView(
        uid="ext", url="http://192.0.2.50:3128", spec=ProxySpec(mode=ProxyMode.EXTERNAL)
    )
    views["ext"] = external
    now[0] += 10
    assert probes(external.url) == ""


def test_a_rotations_replacement_is_probed_with_the_proxys_key() -> None:
    replacement = Replacement(
        rotation_id="r1", provider_id="px-2", url="http://192.0.2.55:3128", state="Running"
    )
    views = {UID: view(provider_id="px-1", replacement=replacement)}
    probes = ProbeCredentials(MASTER, lambda: views, clock=lambda: 1000.0)
    assert probes("http://192.0.2.55:3128").startswith("Basic ")
    assert probes("http://192.0.2.55:3128") == probes("http://192.0.2.7:3128")  # one key
