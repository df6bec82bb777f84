"""The fake proxy service (services/testing/upstream.py) behaves as a residential service's
gateway for real clients (httpx, curl) and a real site (tests/support/egress_site.py): each
service's login is read, a session leaves from its own exit of its country until its lifetime
ends, and the service misbehaves on demand (drops and moves sessions, answers 407, 402, 429,
stalls). Hostile bytes: test_upstream_hostile.py."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from functools import partial
from pathlib import Path

import httpx
import pytest

from services.providers import local_process as proc
from services.providers.pure.targets import AllowedTarget
from services.runtime.ports import free_port
from services.testing.upstream import ControlError
from services.testing.upstream_logins import GRAMMARS
from tests.support.egress_site import EgressSite
from tests.support.upstream_support import (
    ACCOUNT,
    DE,
    FR,
    PASSWORD,
    StartService,
    curl,
    exit_of,
    fetch,
    login,
    site,
    start_service,
)
from tests.support.waiting import until

pytestmark = pytest.mark.integration
__all__ = ["site", "start_service"]  # fixtures


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


def test_a_client_that_waits_for_100_continue_gets_it_and_the_site_s_answer(
    start_service: StartService, site: EgressSite, tmp_path: Path
) -> None:
    service = start_service("decodo")
    user, password = login("decodo", session="ab12cd34", country="fr")
    body = tmp_path / "body"
    body.write_bytes(b"y" * 50_000)
    started = time.monotonic()
    answer = curl(
        "-x",
        f"http://127.0.0.1:{service.proxy_port}",
        "-U",
        f"{user}:{password}",
        "-H",
        "Expect: 100-continue",
        "--expect100-timeout",
        "15",
        "--data-binary",
        f"@{body}",
        site.url("/continue"),
    )
    assert "HTTP/1.1 100 Continue" in answer.stdout, answer.stdout + answer.stderr
    assert "with 50000 bytes" in answer.stdout
    assert exit_of(answer.stdout) in FR
    assert time.monotonic() - started < 10  # answered, not waited out


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


# ----------------------------------------------------------------------------- a Squid as client


async def test_a_squid_chained_to_the_service_leaves_from_the_session_s_exit(
    start_service: StartService, site: EgressSite, tmp_path: Path
) -> None:
    """The product's Squid with the service as its parent, as an upstream proxy's is: plain
    requests and tunnels both leave from the session's exit."""
    service = start_service("oxylabs")
    user, password = login("oxylabs", session="ab12cd34", country="de", minutes=30)
    directory = tmp_path / "squid"
    directory.mkdir()
    port = free_port()
    targets = (AllowedTarget(cidr="127.0.0.1/32", ports=(site.http_port, site.https_port)),)
    command = proc.prepare(proc.SQUID, directory, port, "chained", targets=targets)
    with (directory / "squid.conf").open("a") as config:
        config.write(
            f"cache_peer 127.0.0.1 parent {service.proxy_port} 0 no-query default "
            f"login={user}:{password}\nnever_direct allow all\n"
        )
    pid = proc.spawn(command, directory)
    try:
        await until(partial(proc.accepts, port), timeout=30, what=f"Squid on {port}")
        proxy = f"http://127.0.0.1:{port}"
        plain = await asyncio.to_thread(curl, "-x", proxy, site.url("/plain"))
        tunnel = await asyncio.to_thread(
            curl, "--cacert", str(site.ca_file), "-x", proxy, site.url("/tls", tls=True)
        )
    finally:
        await proc.terminate(pid, directory, grace=1.0)
        proc.remove_leftovers(directory)
    assert "HTTP/1.1 200" in plain.stdout, plain.stdout + plain.stderr
    assert "HTTP/1.1 200" in tunnel.stdout, tunnel.stdout + tunnel.stderr
    assert (
        exit_of(plain.stdout) == exit_of(tunnel.stdout) == service.session("ab12cd34", "de")["exit"]
    )
    assert service.session("ab12cd34", "de")["requests"] == 2
