"""The gateway's user-name grammar, outcomes and heads: pure, total, strict."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.pure import heads
from services.gateway.pure.heads import HeadError, Target
from services.gateway.pure.outcomes import judge, parse_block_codes
from services.gateway.pure.username import MAX_USER, Ask, UserNameError, parse, parse_params


@pytest.mark.parametrize(
    ("user", "ask"),
    [
        ("crawler-a", Ask()),
        ("crawler-a-country-de", Ask(selector={"country": "de"})),
        ("crawler-a-country-de-session-s1", Ask(selector={"country": "de"}, session="s1")),
        ("crawler-a-tier-eu--west", Ask(selector={"tier": "eu-west"})),
        ("crawler-a-pool-crawl/de-ttl-60", Ask(pool="crawl/de", ttl=60)),
        ("crawler-a-pool-de", Ask(pool="default/de")),
        ("crawler-a-egress.country-DE", Ask(selector={"egress.country": "DE"})),
        ("crawler-a-session-a.b_c~d", Ask(session="a.b_c~d")),
    ],
)
def test_a_user_name_says_what_the_request_asks(user: str, ask: Ask) -> None:
    assert parse(user, "crawler-a") == ("crawler-a", ask)


@pytest.mark.parametrize(
    ("user", "names"),
    [
        ("crawler-b-country-de", "must start with the client's name 'crawler-a'"),
        ("crawler-ab", "must start with the client's name"),
        ("crawler-a-country", "'country' has no value"),
        ("crawler-a-country-de-country-fr", "'country' is given twice"),
        ("crawler-a--country-de", "an empty part"),
        ("crawler-a-country-de-", "an empty part"),
        ("crawler-a-ttl-0", "ttl '0' must be whole seconds"),
        ("crawler-a-ttl-1e3", "ttl '1e3'"),
        ("crawler-a-ttl-86401", "ttl '86401'"),
        ("crawler-a-ttl-٣", "ttl '٣'"),
        ("crawler-a-pool-Crawl/DE", "pool 'Crawl/DE' must be NAMESPACE/NAME"),
        ("crawler-a-session-a b", "session 'a b'"),
        ("crawler-a-session-" + "x" * 129, "session"),
        ("crawler-a-.bad-x", "'.bad' is neither session, ttl, pool nor an attribute key"),
        ("crawler-a-country-d\x00e", "the value of 'country'"),
        ("crawler-a-k-v-k-w", "given twice"),
        ("crawler-a-" + "-".join(f"k{i}-v" for i in range(33)), "more than 32 parameters"),
        ("x" * (MAX_USER + 1), "longer than 1024"),
    ],
)
def test_a_bad_user_name_is_refused_naming_what_is_wrong(user: str, names: str) -> None:
    with pytest.raises(UserNameError, match=None) as caught:
        parse(user, "crawler-a")
    assert names in str(caught.value)
    assert 'docs/gateway.md, "User names"' in str(caught.value)


def test_an_open_gateway_takes_the_first_segment_as_the_label() -> None:
    assert parse("team-country-de", None) == ("team", Ask(selector={"country": "de"}))
    assert parse("my--team", None) == ("my-team", Ask())


@given(st.text(max_size=300), st.one_of(st.none(), st.sampled_from(["crawler-a", "c"])))
def test_any_text_is_an_ask_or_a_named_refusal(user: str, client: str | None) -> None:
    refused: UserNameError | None = None
    try:
        label, ask = parse(user, client)
    except UserNameError as exc:
        refused = exc
    if refused is not None:
        assert str(refused).startswith(("user name:", "parameters:"))
        return
    assert label
    assert all(key and value for key, value in ask.selector.items())
    assert ask.ttl is None or 1 <= ask.ttl <= 86_400


def test_the_header_takes_the_same_parameters() -> None:
    assert parse_params("country-de-session-s1") == Ask(selector={"country": "de"}, session="s1")
    assert parse_params("") == Ask()


@pytest.mark.parametrize(
    ("status", "squid", "method", "outcome", "retry"),
    [
        (200, False, "GET", "success", False),
        (404, False, "GET", "success", False),
        (403, False, "GET", "blocked", True),
        (429, False, "HEAD", "blocked", True),
        (403, False, "POST", "blocked", False),
        (503, True, "GET", "failed", True),
        (503, False, "GET", "success", False),
    ],
)
def test_a_response_is_judged_by_its_status_and_who_made_it(
    status: int, squid: bool, method: str, outcome: str, retry: bool
) -> None:
    verdict = judge(status, squid, method)
    assert (verdict.outcome, verdict.retry) == (outcome, retry)


def test_a_request_is_retried_once_never_in_a_session_never_without_its_body() -> None:
    assert not judge(403, False, "GET", attempt=1).retry
    assert not judge(403, False, "GET", sticky=True).retry
    assert not judge(403, False, "GET", replayable=False).retry
    assert judge(418, False, "GET", block_codes=(418,)).outcome == "blocked"


def test_block_codes_are_statuses_from_400_to_599() -> None:
    assert parse_block_codes("429, 403,403") == (403, 429)
    for bad in ("200", "4o3", "600", "-403", "\uff14\uff10\uff13"):
        with pytest.raises(ValueError, match="--block-codes"):
            parse_block_codes(bad)


def _basic(text: str) -> list[heads.Header]:
    return [(b"Proxy-Authorization", b"Basic " + base64.b64encode(text.encode()))]


def test_the_login_is_read_from_basic_and_percent_escapes_are_decoded() -> None:
    assert heads.login(_basic("crawler-a-pool-crawl%2Fde:tok")) == (
        "crawler-a-pool-crawl/de",
        "tok",
    )
    assert heads.login(_basic("user:pa:ss")) == ("user", "pa:ss")
    assert heads.login(_basic("nocolon")) is None
    assert heads.login([(b"Proxy-Authorization", b"Bearer x")]) is None
    assert heads.login([(b"Proxy-Authorization", b"Basic !!!")]) is None
    assert heads.login([]) is None


@pytest.mark.parametrize(
    ("method", "url", "target"),
    [
        ("CONNECT", b"shop.example:443", Target("shop.example", 443, "https")),
        ("CONNECT", b"[::1]:8443", Target("::1", 8443, "https")),
        ("GET", b"http://Shop.Example/a?b", Target("shop.example", 80, "http")),
        ("GET", b"http://shop.example:8080/", Target("shop.example", 8080, "http")),
    ],
)
def test_a_target_is_read_from_the_request_line(method: str, url: bytes, target: Target) -> None:
    assert heads.target(method, url) == target


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", b"/origin-form"),
        ("GET", b"ftp://shop.example/"),
        ("GET", b"http://user:pw@shop.example/"),
        ("GET", b"http://shop.example:99999/"),
        ("CONNECT", b"shop.example"),
        ("CONNECT", b"shop.example:443/path"),
    ],
)
def test_a_target_the_gateway_cannot_relay_is_a_400(method: str, url: bytes) -> None:
    with pytest.raises(HeadError) as caught:
        heads.target(method, url)
    assert caught.value.status == 400


def test_the_gateway_refuses_its_own_ports_on_local_addresses() -> None:
    own = (8000, 8080, 4222)
    for host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "127.9.9.9", "api.localhost"):
        assert heads.denied(Target(host, 8080, "http"), own), host
    assert heads.denied(Target("127.0.0.1", 9999, "http"), own) is None
    assert heads.denied(Target("shop.example", 8080, "http"), own) is None


def test_the_head_sent_on_carries_the_lease_login_and_none_of_the_hop_by_hop_headers() -> None:
    sent = heads.upstream_head(
        b"GET",
        b"http://shop.example/",
        b"1.1",
        [
            (b"Host", b"shop.example"),
            (b"Proxy-Authorization", b"Basic secret"),
            (b"Proxy-Connection", b"keep-alive"),
            (b"Connection", b"x-private, keep-alive"),
            (b"X-Private", b"1"),
            (b"X-Egress-Params", b"country-de"),
            (b"Accept", b"*/*"),
        ],
        b"lease:login",
    )
    lines = sent.split(b"\r\n")
    assert lines[0] == b"GET http://shop.example/ HTTP/1.1"
    assert b"Host: shop.example" in lines
    assert b"Accept: */*" in lines
    assert b"Proxy-Authorization: Basic " + base64.b64encode(b"lease:login") in lines
    for gone in (b"secret", b"Proxy-Connection", b"X-Private", b"X-Egress", b"x-private"):
        assert gone not in sent
    assert [line for line in lines if line.startswith(b"Connection")] == [b"Connection: keep-alive"]
    assert sent.endswith(b"\r\n\r\n")
    closing = heads.upstream_head(b"GET", b"http://a/", b"1.0", [], None, keep_alive=False)
    assert b"\r\nConnection: close\r\n" in closing


def test_an_answer_of_the_gateway_names_its_reason_in_a_clean_header() -> None:
    text = heads.answer(407, "bad\r\nInjected: yes", extra=[heads.CHALLENGE])
    head = text.split(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 407 Proxy Authentication Required")
    assert b"X-Egress-Error: bad??Injected: yes" in head
    assert b"\r\nInjected" not in head
    assert b'Proxy-Authenticate: Basic realm="egress-proxies"' in head
