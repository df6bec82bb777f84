"""Whatever bytes reach the fake proxy service (services/testing/upstream.py), on its proxy
port or its control port, get an answer or a closed connection, never a crash, and the service
stays up; a service started with settings it cannot serve does not start and says why."""

from __future__ import annotations

import random
import re

import pytest

from tests.support.egress_site import EgressSite
from tests.support.upstream_support import (
    StartService,
    basic,
    exchange,
    fetch,
    login,
    site,
    start_service,
)

pytestmark = pytest.mark.integration
__all__ = ["site", "start_service"]  # fixtures


@pytest.mark.parametrize(
    ("grammar", "options", "said"),
    [
        ("oxylabs", {"countries": {"de": "10.0.0.1-10.0.0.5"}}, "loopback"),
        ("oxylabs", {"countries": {"de": "127.0.2.1", "fr": "127.0.2.1"}}, "already de's"),
        ("oxylabs", {"password": ""}, "password"),
        ("oxylabs", {"session_seconds": 0}, "session-seconds"),
        ("generic", {"user_template": "{account}-{sesion}"}, "sesion"),
        ("generic", {"user_template": "{account}-{country}"}, "need {session}"),
    ],
)
def test_a_service_that_cannot_serve_does_not_start_and_says_why(
    grammar: str, options: dict[str, object], said: str, start_service: StartService
) -> None:
    with pytest.raises(RuntimeError, match=re.escape(said)):
        start_service(grammar, **options)


def test_hostile_bytes_on_the_proxy_port_are_refused_and_the_service_stays_up(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    good = basic(*login("oxylabs", session="ab12cd34", country="de"))
    url = site.url("/x").encode()
    cases = {
        b"\x00\xff garbage \r\n\r\n": b"HTTP/1.1 400",
        b"GET /x HTTP/1.1\nHost: a\n\n": b"HTTP/1.1 400",
        b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n": b"HTTP/1.1 400",
        b"GET " + url + b" HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n": b"HTTP/1.1 431",
        b"CONNECT nowhere HTTP/1.1\r\n\r\n": b"HTTP/1.1 400",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": b"HTTP/1.1 4",
        b"GET " + url + b" HTTP/1.1\r\nProxy-Authorization: Basic %%%\r\n\r\n": b"HTTP/1.1 407",
        b"POST "
        + url
        + b" HTTP/1.1\r\n"
        + good
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n": b"HTTP/1.1 411",
        b"POST "
        + url
        + b" HTTP/1.1\r\n"
        + good
        + b"\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n": b"HTTP/1.1 400",
        b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n" % service.control_port
        + good
        + b"\r\n\r\n": b"HTTP/1.1 403",
        b"GET " + url + b" HTTP/1.1\r\n" + basic("x" * 2000, "y") + b"\r\n\r\n": b"HTTP/1.1 407",
    }
    for data, expected in cases.items():
        answer = exchange(service.proxy_port, data)
        assert answer.startswith(expected), (data[:80], answer[:200])
    assert (
        fetch(
            service, site.url("/after"), login("oxylabs", session="ab12cd34", country="de")
        ).status_code
        == 200
    )
    assert [v.path for v in site.visits] == ["/after"]
    assert service.process is not None
    assert service.process.poll() is None


def test_random_bytes_get_an_answer_or_a_closed_connection_never_a_crash(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("brightdata")
    chance = random.Random(39)
    prefixes = [b"", b"GET http://127.0.0.1/ HTTP/1.1\r\n", b"CONNECT a:1 HTTP/1.1\r\n"]
    for _ in range(60):
        noise = chance.randbytes(chance.randint(0, 3000))
        if chance.random() < 0.5:
            noise = noise.replace(b"\n", b"\r\n") + b"\r\n\r\n"
        for port in (service.proxy_port, service.control_port):
            answer = exchange(port, chance.choice(prefixes) + noise)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:200]
    credentials = login("brightdata", session="ab12cd34", country="de")
    assert fetch(service, site.url("/after"), credentials).status_code == 200
    assert service.health()["grammar"] == "brightdata"


def test_hostile_bytes_on_the_control_port_are_refused_and_it_stays_up(
    start_service: StartService,
) -> None:
    service = start_service("decodo")

    def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
        head = b"POST %s HTTP/1.1\r\nHost: c\r\nContent-Length: %d\r\n%s\r\n" % (
            path.encode(),
            len(body),
            extra,
        )
        return exchange(service.control_port, head + body)

    cases = [
        (exchange(service.control_port, b"\x16\x03\x01 not http\r\n\r\n"), b"HTTP/1.1 400"),
        (post("/faults", b"{not json"), b"HTTP/1.1 400"),
        (post("/faults", b"[1, 2]"), b"HTTP/1.1 400"),
        (post("/faults", b'{"status": 500}'), b"HTTP/1.1 400"),
        (post("/faults", b'{"status": true}'), b"HTTP/1.1 400"),
        (post("/faults", b'{"status": 429, "times": 0}'), b"HTTP/1.1 400"),
        (post("/faults", b'{"status": 429, "retryAfter": -1}'), b"HTTP/1.1 400"),
        (post("/faults", b'{"status": 429, "evil": 1}'), b"HTTP/1.1 400"),
        (post("/stalls", b'{"session": "../../x"}'), b"HTTP/1.1 400"),
        (post("/sessions/%2e%2e/drop", b""), b"HTTP/1.1 400"),
        (post("/nowhere", b"{}"), b"HTTP/1.1 404"),
        (post("/faults", b"", b"Content-Length: 99999999\r\n"), b"HTTP/1.1 400"),
        (
            exchange(
                service.control_port, b"POST /faults HTTP/1.1\r\nContent-Length: 999999\r\n\r\n"
            ),
            b"HTTP/1.1 413",
        ),
        (
            exchange(
                service.control_port,
                b"POST /faults HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ),
            b"HTTP/1.1 411",
        ),
    ]
    for answer, expected in cases:
        assert answer.startswith(expected), answer[:200]
        assert b'"error"' in answer
    health = service.health()
    assert health["grammar"] == "decodo"
    assert service.call("GET", "/sessions") == {"sessions": []}
    assert service.call("DELETE", "/faults") == {"faults": 0, "stalls": 0}
