"""The fake proxy service (services/testing/upstream.py) behaves as a residential service's
gateway for real clients (httpx, curl) and a real site (tests/support/egress_site.py): each
service's login is read, a session leaves from its own exit of its country until its lifetime
ends, and the service misbehaves on demand (drops and moves sessions, answers 407, 402, 429,
stalls). Whatever bytes reach either port get an answer, and the service stays up."""

from __future__ import annotations

import base64
import itertools
import random
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.testing.upstream import ControlError, UpstreamService
from services.testing.upstream_logins import GRAMMARS
from tests.support.cli_process import clean_env
from tests.support.egress_site import EgressSite, egress_site
from tests.support.upstream_support import (
    ACCOUNT,
    DE,
    FR,
    PASSWORD,
    StartService,
    login,
    start_service,
)

pytestmark = pytest.mark.integration
__all__ = ["start_service"]  # a fixture
SEEN = re.compile(r"seen from (\S+)")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[EgressSite]:
    with egress_site(tmp_path) as running:
        yield running


def fetch(
    service: UpstreamService,
    url: str,
    credentials: tuple[str, str],
    *,
    verify: bool | ssl.SSLContext = True,
    timeout: float = 10.0,
    **request: object,
) -> httpx.Response:
    proxy = service.proxy_url(*credentials)
    with httpx.Client(proxy=proxy, verify=verify, timeout=timeout, trust_env=False) as client:
        method = str(request.pop("method", "GET"))
        return client.request(method, url, **request)  # type: ignore[arg-type]


def exit_of(answer: httpx.Response | str) -> str:
    """The address the site saw the request come from."""
    text = answer if isinstance(answer, str) else answer.text
    found = SEEN.search(text)
    assert found is not None, text
    return found[1]


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "-i", "--noproxy", "", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=clean_env(),
    )


# ----------------------------------------------------------------------------- logins and exits


@pytest.mark.parametrize("grammar", GRAMMARS)
def test_each_service_s_login_is_read_and_a_session_keeps_its_exit(
    grammar: str, start_service: StartService, site: EgressSite
) -> None:
    service = start_service(grammar)
    first = login(grammar, session="ab12cd34", country="de", minutes=30)
    seen = {exit_of(fetch(service, site.url(f"/{grammar}/{n}"), first)) for n in range(3)}
    assert len(seen) == 1
    (kept,) = seen
    assert kept in DE
    other = exit_of(
        fetch(service, site.url("/other"), login(grammar, session="ef56gh78", country="de"))
    )
    assert other in DE
    assert other != kept
    french = exit_of(
        fetch(service, site.url("/fr"), login(grammar, session="ij90kl12", country="fr"))
    )
    assert french in FR
    assert [v.address for v in site.visits] == [kept, kept, kept, other, french]
    asked = [a["login"] for a in service.attempts() if a["status"] == 200]
    assert asked[0]["session"] == "ab12cd34"
    assert asked[0]["country"] == "de"
    assert asked[0]["account"] == ACCOUNT
    # Bright Data keeps a session's exit while it is used; the others read the minutes asked.
    assert asked[0]["seconds"] == (None if grammar == "brightdata" else 1800)


def test_curl_logs_in_through_the_password_s_options(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("iproyal")
    user, password = login("iproyal", session="ab12cd34", country="fr", minutes=10)
    answers = [
        curl(
            "-x",
            f"http://127.0.0.1:{service.proxy_port}",
            "-U",
            f"{user}:{password}",
            site.url("/c"),
        )
        for _ in range(2)
    ]
    assert all(a.stdout.startswith("HTTP/1.1 200") for a in answers), answers
    exits = {exit_of(a.stdout) for a in answers}
    assert len(exits) == 1
    assert exits <= set(FR)


def test_requests_without_a_session_leave_from_a_fresh_exit_each(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    held = exit_of(fetch(service, site.url("/held"), login("oxylabs", session="s1", country="de")))
    rotating = [
        exit_of(fetch(service, site.url(f"/r{n}"), login("oxylabs", country="de")))
        for n in range(4)
    ]
    assert all(a != b for a, b in itertools.pairwise(rotating)), rotating
    assert held not in rotating
    assert set(rotating) <= set(DE)


def test_a_session_takes_another_exit_of_its_country_when_its_lifetime_ends(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("decodo", session_seconds=1.0)
    credentials = login("decodo", session="ab12cd34", country="de", minutes=30)
    first = exit_of(fetch(service, site.url("/one"), credentials))
    assert service.session("ab12cd34", "de")["exit"] == first
    deadline = time.monotonic() + 10
    later = first
    while later == first and time.monotonic() < deadline:
        time.sleep(0.3)
        later = exit_of(fetch(service, site.url("/again"), credentials))
    assert later != first
    assert later in DE


def test_a_tunnel_leaves_from_the_session_s_exit(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("brightdata")
    credentials = login("brightdata", session="ab12cd34", country="fr")
    over_httpx = exit_of(
        fetch(
            service,
            site.url("/tls", tls=True),
            credentials,
            verify=ssl.create_default_context(cafile=str(site.ca_file)),
        )
    )
    user, password = credentials
    over_curl = curl(
        "--cacert",
        str(site.ca_file),
        "-x",
        f"http://127.0.0.1:{service.proxy_port}",
        "-U",
        f"{user}:{password}",
        site.url("/tls2", tls=True),
    )
    assert "HTTP/1.1 200" in over_curl.stdout, over_curl.stdout + over_curl.stderr
    assert exit_of(over_curl.stdout) == over_httpx
    assert over_httpx in FR
    assert [v.scheme for v in site.visits] == ["https", "https"]
    traffic = service.session("ab12cd34", "fr")
    assert traffic["requests"] == 2
    assert traffic["bytesDown"] > 0  # the site's certificate and answer, through the tunnel


def test_a_body_arrives_whole_and_every_byte_is_counted(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    body = b"x" * 100_000
    answer = fetch(
        service,
        site.url("/upload"),
        login("oxylabs", session="ab12cd34", country="de"),
        method="POST",
        content=body,
    )
    assert answer.status_code == 200
    assert "with 100000 bytes" in answer.text
    traffic = service.session("ab12cd34", "de")
    assert traffic["requests"] == 1
    assert traffic["bytesUp"] > len(body)
    assert traffic["bytesDown"] > len(answer.content)
    assert service.session("ab12cd34", "de")["bytesUp"] < len(body) + 2000


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("credentials", "reason"),
    [
        (login("oxylabs", session="s1", country="de", password="wrong"), "wrong password"),
        (login("oxylabs", session="s1", country="de", account="someone"), "no account"),
        (("customer-acme-country-de", PASSWORD), "no option 'country'"),
        (("customer-acme-cc-de-sessid-s1-sessid-s2", PASSWORD), "given twice"),
        (("garbage", PASSWORD), "does not parse"),
    ],
)
def test_a_login_the_service_refuses_is_answered_407_saying_why(
    credentials: tuple[str, str], reason: str, start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    answer = fetch(service, site.url("/no"), credentials)
    assert answer.status_code == 407
    assert reason in answer.text
    assert PASSWORD not in answer.text
    assert answer.headers["Proxy-Authenticate"].startswith("Basic")
    assert not site.visits


def test_without_a_login_the_service_asks_for_one(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("decodo")
    bare = curl("-x", f"http://127.0.0.1:{service.proxy_port}", site.url("/bare"))
    assert bare.stdout.startswith("HTTP/1.1 407"), bare.stdout + bare.stderr
    assert "Proxy-Authenticate: Basic" in bare.stdout
    assert "no Proxy-Authorization" in bare.stdout


def test_a_country_the_service_does_not_serve_is_refused(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("brightdata")
    answer = fetch(service, site.url("/us"), login("brightdata", session="s1", country="us"))
    assert answer.status_code == 400
    assert "de, fr" in answer.text
    wrong_zone = fetch(
        service, site.url("/z"), ("brd-customer-acme-zone-other-country-de-session-s1", PASSWORD)
    )
    assert wrong_zone.status_code == 407
    assert "no zone 'other'" in wrong_zone.text
    assert not site.visits


# ----------------------------------------------------------------------------- misbehaviour


def test_a_dropped_session_comes_back_on_another_exit(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    credentials = login("oxylabs", session="ab12cd34", country="fr")
    first = exit_of(fetch(service, site.url("/1"), credentials))
    service.drop("ab12cd34")
    second = exit_of(fetch(service, site.url("/2"), credentials))
    assert second != first
    assert second in FR
    assert service.session("ab12cd34", "fr")["requests"] == 2
    with pytest.raises(ControlError) as unknown:
        service.drop("nosuchsession")
    assert unknown.value.status == 404


def test_a_moved_session_leaves_from_its_new_exit(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("decodo")
    credentials = login("decodo", session="ab12cd34", country="de")
    first = exit_of(fetch(service, site.url("/1"), credentials))
    (moved,) = service.move("ab12cd34")
    assert moved != first
    assert exit_of(fetch(service, site.url("/2"), credentials)) == moved
    assert moved in DE


@pytest.mark.parametrize(
    ("status", "said"), [(407, "suspended"), (402, "used up"), (429, "slow down")]
)
def test_the_service_answers_a_fault_as_many_times_as_told(
    status: int, said: str, start_service: StartService, site: EgressSite
) -> None:
    service = start_service("oxylabs")
    credentials = login("oxylabs", session="ab12cd34", country="de")
    service.fail(status, times=2, retry_after=7)
    answers = [fetch(service, site.url(f"/{n}"), credentials) for n in range(3)]
    assert [a.status_code for a in answers] == [status, status, 200]
    assert said in answers[0].text
    if status == 429:
        assert answers[0].headers["Retry-After"] == "7"
    assert len(site.visits) == 1


def test_a_fault_until_cleared_and_one_session_s_fault(
    start_service: StartService, site: EgressSite
) -> None:
    service = start_service("brightdata")
    mine = login("brightdata", session="mine1", country="de")
    theirs = login("brightdata", session="theirs1", country="de")
    service.fail(402, times=None, session="mine1")
    assert [fetch(service, site.url("/m"), mine).status_code for _ in range(3)] == [402] * 3
    assert fetch(service, site.url("/t"), theirs).status_code == 200
    service.fail(429, times=None)
    answer = fetch(service, site.url("/t"), theirs)
    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "1"
    service.clear()
    assert fetch(service, site.url("/m"), mine).status_code == 200


def test_a_stalled_request_is_never_answered(start_service: StartService, site: EgressSite) -> None:
    service = start_service("iproyal")
    credentials = login("iproyal", session="ab12cd34", country="de")
    service.stall(times=1)
    with pytest.raises(httpx.ReadTimeout):
        fetch(service, site.url("/stalled"), credentials, timeout=1.0)
    assert [a["reason"] for a in service.attempts()] == ["stalled"]
    assert fetch(service, site.url("/after"), credentials).status_code == 200
    assert [v.path for v in site.visits] == ["/after"]


# ----------------------------------------------------------------------------- hostile bytes


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


def exchange(port: int, data: bytes, *, timeout: float = 15.0) -> bytes:
    """Send ``data`` and read until the server closes (or ``timeout``)."""
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
    return b"Proxy-Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode())


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
