"""The doorman remembers a login that passed only while the clients table it passed against is in
force: a client removed from the file is refused at its next request."""

from __future__ import annotations

import base64
from pathlib import Path

from prometheus_client import CollectorRegistry

from services.gateway.doorman import Doorman
from services.gateway.metrics import GatewayMetrics
from services.gateway.pure.heads import Header
from services.runtime.clients import Clients
from tests.support.gateway import TOKENS, gateway_clients


def _login(user: str, token: str) -> list[Header]:
    value = base64.b64encode(f"{user}:{token}".encode())
    return [(b"Proxy-Authorization", b"Basic " + value)]


def test_a_remembered_login_is_forgotten_when_the_clients_change(tmp_path: Path) -> None:
    path = gateway_clients(tmp_path / "clients.yaml")
    clients = Clients(path)
    doorman = Doorman(clients, GatewayMetrics(CollectorRegistry()))
    headers = _login("crawler-a-country-de", TOKENS["crawler-a"])
    first = doorman.who(headers, "10.0.0.1")
    assert not isinstance(first, bytes)
    assert doorman.who(headers, "10.0.0.1") is first  # remembered
    path.write_text(path.read_text().replace("crawler-a", "crawler-z"))
    assert clients.poll()
    refused = doorman.who(headers, "10.0.0.1")
    assert isinstance(refused, bytes)
    assert refused.startswith(b"HTTP/1.1 407 ")


def test_a_throttled_address_is_refused_even_with_a_remembered_login(tmp_path: Path) -> None:
    clients = Clients(gateway_clients(tmp_path / "clients.yaml"))
    doorman = Doorman(clients, GatewayMetrics(CollectorRegistry()))
    good = _login("crawler-a", TOKENS["crawler-a"])
    assert not isinstance(doorman.who(good, "10.0.0.2"), bytes)
    for n in range(5):
        assert isinstance(doorman.who(_login("crawler-a", f"wrong-{n}"), "10.0.0.2"), bytes)
    throttled = doorman.who(good, "10.0.0.2")
    assert isinstance(throttled, bytes)
    assert throttled.startswith(b"HTTP/1.1 429 ")
    assert not isinstance(doorman.who(good, "10.0.0.3"), bytes)  # the owner elsewhere
