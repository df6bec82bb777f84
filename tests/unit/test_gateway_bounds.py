"""The gateway's bounds and head rules that need no server (D156): the connection total fitted
under the descriptor limit, the spellings of a local address, and heads fed to the reader."""

from __future__ import annotations

import pytest

from services.gateway.bounds import FD_RESERVE, Limits, idle_upstream
from services.gateway.pure.heads import HeadError, Target, denied, target
from services.gateway.reading import MAX_HEAD, parse_request, take_head


def test_crawlers_and_proxies_share_the_descriptor_limit() -> None:
    fitted = Limits().fitted(20_000)
    assert fitted.upstreams == (20_000 - FD_RESERVE) // 4
    assert fitted.connections == 20_000 - FD_RESERVE - fitted.upstreams
    assert fitted.connections >= 10_000  # a crawl's 10,000 idle sessions fit under ulimit -n
    small = Limits().fitted(1024)
    assert small.connections + small.upstreams + FD_RESERVE == 1024
    assert idle_upstream(1024) == 128
    assert Limits(connections=100, upstreams=50).fitted(20_000) == Limits(
        connections=100, upstreams=50
    )
    assert Limits(per_address=7, head_timeout=1).fitted(1024).per_address == 7


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "localhost.",
        "a.localhost",
        "::1",
        "127.1",
        "0x7f000001",
        "2130706433",
        "0177.0.0.1",
        "0",
        "0.0.0.0",
        "::ffff:127.0.0.1",
        "fe80::1%eth0",
        "127.9.9.9",
    ],
)
def test_every_spelling_of_a_local_address_is_denied_on_an_own_port(host: str) -> None:
    assert denied(Target(host, 8000, "http"), [8000])
    assert denied(Target(host, 8001, "http"), [8000]) is None


@pytest.mark.parametrize("host", ["example.com", "10.0.0.1", "1.2.3.4.5", "08", "256.1", "::2"])
def test_other_hosts_are_left_to_the_proxies(host: str) -> None:
    assert denied(Target(host, 8000, "http"), [8000]) is None


@pytest.mark.parametrize("authority", [b"x", b"x:0", b"x:99999", b"[::1", b"x:443/p", b"u@x:1"])
def test_connect_needs_a_host_and_a_port(authority: bytes) -> None:
    with pytest.raises(HeadError, match="CONNECT needs host:port"):
        target("CONNECT", authority)


def _read(raw: bytes) -> object:
    try:
        head = take_head(bytearray(raw), eof=True)
        assert head is not None  # at the end of the bytes, a head or nothing
        return parse_request(head) if head else None
    except HeadError as exc:
        return exc.status


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET http://x/ HTTP/1.1\nHost: x\n\n", 400),
        (b"GET http://x/ HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", 400),
        (b"GET http://x/ HTTP/1.1\r\n" + b"X: y\r\n" * 129 + b"\r\n", 431),
        (b"GET http://x/ HTTP/1.1\r\nX: " + b"y" * MAX_HEAD + b"\r\n\r\n", 431),
        (b"GET http://x/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"GET http://x/ HTTP/2.0\r\n\r\n", 505),
        (b"GET http://x/ HTTP/1.1\r\nHost: x\r\n", 400),
        (b"\r\n" * 5 + b"GET http://x/ HTTP/1.1\r\n\r\n", 400),
    ],
)
def test_a_head_the_gateway_will_not_read_is_refused_with_its_status(
    raw: bytes, status: int
) -> None:
    assert _read(raw) == status


def test_connection_close_is_seen_and_empty_lines_before_a_request_are_skipped() -> None:
    request = _read(b"\r\n\r\nGET http://x/ HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert getattr(request, "keep_alive", None) is False
    request = _read(b"GET http://x/ HTTP/1.0\r\nProxy-Connection: keep-alive\r\n\r\n")
    assert getattr(request, "keep_alive", None) is True
    assert _read(b"") is None


def test_a_head_cut_at_every_byte_is_taken_once_whole_and_what_follows_stays() -> None:
    head = b"\r\nGET http://x/ HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\r\n"
    for cut in range(len(head)):
        buffer = bytearray(head[:cut])
        assert take_head(buffer) is None, cut
        assert buffer == head[:cut]
    buffer = bytearray(head + b"GET http://y/")
    assert take_head(buffer) == head[2:]  # the empty line before it skipped
    assert buffer == b"GET http://y/"
    assert take_head(buffer) is None
    bare = bytearray(b"GET http://x/ HTTP/1.1\r\n\r\n")
    assert take_head(bare) == b"GET http://x/ HTTP/1.1\r\n\r\n"


@pytest.mark.parametrize(
    "raw",
    [
        b"GET http://x/ HTTP/1.1\n",
        b"\n",
        b"GET http://x/ HTTP/1.1\r\n\nX",
        b"GET http://x/ HTTP/1.1\r\nX\n",
        b"\r\n" * 5 + b"G",
    ],
)
def test_a_bare_lf_is_refused_before_the_head_could_end(raw: bytes) -> None:
    """Not waited on until the head timeout: the request line and the first field line are
    judged as soon as they are whole."""
    with pytest.raises(HeadError) as refused:
        take_head(bytearray(raw))
    assert refused.value.status == 400


def test_a_head_longer_than_its_bound_is_refused_before_it_ends() -> None:
    with pytest.raises(HeadError) as refused:
        take_head(bytearray(b"GET http://x/ HTTP/1.1\r\nX: " + b"y" * MAX_HEAD))
    assert refused.value.status == 431
