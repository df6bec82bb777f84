"""The fake proxy service (services/testing/upstream.py) for the tests: an account, a country
map of loopback exits, logins in each service's grammar, the service as a fixture that starts
its process on free ports and stops it after the test, and the clients the tests fetch with
(httpx, curl, a raw socket) through it to the egress site, which tells the exit it saw.

``login`` writes a user name and password the way each service's documentation shows them,
from this table and not from the provider's templates, so a test that fetches through the
provider and the fake checks one against the other.
"""

from __future__ import annotations

import base64
import re
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.testing.upstream import UpstreamService
from tests.support.cli_process import clean_env
from tests.support.egress_site import EgressSite, egress_site
from tests.support.markers import starts

ACCOUNT = "acme"
PASSWORD = "Up5treamPw_9c2f7e"
"""Shaped like a service's password (letters, digits, an underscore), so a leak would look like
one."""
DE = tuple(f"127.0.2.{n}" for n in range(1, 9))
FR = tuple(f"127.0.3.{n}" for n in range(1, 5))
COUNTRIES = {"de": f"{DE[0]}-{DE[-1]}", "fr": f"{FR[0]}-{FR[-1]}"}
GENERIC_USER = "acct.{account}.geo.{COUNTRY}.sid.{session}"
GENERIC_PASSWORD = "{password}~t{minutes}"
ZONE = "resi_eu"
SEEN = re.compile(r"seen from (\S+)")


def login(
    grammar: str,
    *,
    session: str = "",
    country: str = "",
    minutes: int = 0,
    account: str = ACCOUNT,
    password: str = PASSWORD,
) -> tuple[str, str]:
    """The (user, password) of a login in ``grammar``; empty parts are left out."""
    parts: list[tuple[str, str]]
    if grammar == "iproyal":
        options = [("country", country), ("session", session)]
        options.append(("lifetime", f"{minutes}m" if minutes else ""))
        return account, password + "".join(f"_{k}-{v}" for k, v in options if v)
    if grammar == "generic":
        user = GENERIC_USER.format(account=account, COUNTRY=country.upper(), session=session)
        return user, GENERIC_PASSWORD.format(password=password, minutes=minutes or 10)
    if grammar == "brightdata":
        parts = [("brd-customer", account), ("zone", ZONE), ("country", country)]
        parts.append(("session", session))
    elif grammar == "oxylabs":
        parts = [("customer", account), ("cc", country.upper()), ("sessid", session)]
        parts.append(("sesstime", str(minutes) if minutes and session else ""))
    elif grammar == "decodo":
        parts = [("user", account), ("country", country), ("session", session)]
        parts.append(("sessionduration", str(minutes) if minutes and session else ""))
    else:
        raise ValueError(grammar)
    return "-".join(f"{k}-{v}" for k, v in parts if v), password


def service_options(grammar: str) -> dict[str, Any]:
    """What the fake needs beside the account for ``grammar``: the generic templates, the zone
    Bright Data logins name."""
    if grammar == "generic":
        return {"user_template": GENERIC_USER, "password_template": GENERIC_PASSWORD}
    if grammar == "brightdata":
        return {"zone": ZONE}
    return {}


StartService = Callable[..., UpstreamService]


@pytest.fixture
@starts("the fake proxy service's process")
def start_service() -> Iterator[StartService]:
    """Start the fake with a grammar (and any ``UpstreamService`` option): the account, the
    password and the country map are the module's unless given. Stopped after the test."""
    started: list[UpstreamService] = []

    def start(grammar: str, **options: Any) -> UpstreamService:
        settings: dict[str, Any] = {
            "account": ACCOUNT,
            "password": PASSWORD,
            "countries": COUNTRIES,
            **service_options(grammar),
            **options,
        }
        service = UpstreamService(grammar, **settings)
        started.append(service)
        return service.start()

    yield start
    for service in started:
        service.stop()


@pytest.fixture
@starts("the egress site's HTTP servers")
def site(tmp_path: Path) -> Iterator[EgressSite]:
    with egress_site(tmp_path) as running:
        yield running


def fetch(
    service: UpstreamService,
    url: str,
    credentials: tuple[str, str],
    *,
    method: str = "GET",
    content: bytes | None = None,
    verify: bool | ssl.SSLContext = True,
    timeout: float = 10.0,
) -> httpx.Response:
    """One request with httpx through the service, with this login."""
    proxy = service.proxy_url(*credentials)
    with httpx.Client(proxy=proxy, verify=verify, timeout=timeout, trust_env=False) as client:
        return client.request(method, url, content=content)


def exit_of(answer: httpx.Response | str) -> str:
    """The address the site saw the request come from."""
    text = answer if isinstance(answer, str) else answer.text
    found = SEEN.search(text)
    assert found is not None, text
    return found[1]


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    """curl with its answer's head (``-i``), no proxy from the environment."""
    return subprocess.run(
        ["curl", "-sS", "-i", "--noproxy", "", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=clean_env(),
    )


def exchange(port: int, data: bytes, *, timeout: float = 15.0) -> bytes:
    """Send ``data`` as it is, and read until the server closes (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return received


def basic(user: str, password: str) -> bytes:
    """A ``Proxy-Authorization`` header line for a raw request."""
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode())
