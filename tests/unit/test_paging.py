"""The listings' paging rules (``services.discovery.pure.paging`` and ``queries.parse_paging``):
limits, tokens bound to their listing and filters, and a key cursor that survives changes."""

from __future__ import annotations

import base64

import pytest

from services.discovery.http.errors import InvalidRequest
from services.discovery.http.queries import InvalidContinue, parse_paging
from services.discovery.pure.errorcodes import STATUS, ErrorCode
from services.discovery.pure.paging import (
    MAX_LIMIT,
    TOKEN_VERSION,
    BadLimit,
    BadToken,
    decode_token,
    encode_token,
    parse_limit,
    scope,
    start_after,
)

KEYS = [("a", f"n{i:02d}", f"u{i}") for i in range(10)]


def test_limit_is_a_whole_number_in_range_or_absent() -> None:
    assert parse_limit(None) is None
    assert parse_limit("1") == 1
    assert parse_limit(f" {MAX_LIMIT} ") == MAX_LIMIT
    for bad in ("0", "-3", str(MAX_LIMIT + 1), "x", "", "1.5", "²", "9" * 500):
        with pytest.raises(BadLimit, match=r"limit: .* 1 to 1000"):
            parse_limit(bad)


def test_a_token_round_trips_only_for_its_listing_and_width() -> None:
    where = scope("proxies", [("phase", "Ready"), ("attr.a", "1")])
    assert where == scope("proxies", [("attr.a", "1"), ("phase", "Ready")])  # any order
    assert where != scope("leases", [("phase", "Ready"), ("attr.a", "1")])
    token = encode_token(where, ("ns", "name", "uid"))
    assert token.isascii()
    assert "=" not in token
    assert decode_token(token, where, 3) == ("ns", "name", "uid")
    for other, width in ((scope("proxies", []), 3), (where, 2)):
        with pytest.raises(BadToken, match="start the listing again"):
            decode_token(token, other, width)
    for garbage in ("", "!!", "AQ", token[:-2], "A" * 5000, "é", encode_token(where, ("1",))[1:]):
        with pytest.raises(BadToken):
            decode_token(garbage, where, 3)


def test_a_page_starts_after_the_key_whether_or_not_it_is_still_there() -> None:
    assert start_after(KEYS, None) == 0
    assert start_after(KEYS, KEYS[3]) == 4
    gone = ("a", "n03x", "z")  # between n03 and n04: removed since
    assert start_after(KEYS, gone) == 4


def test_pages_chain_to_the_end_and_count_the_matches() -> None:
    paging, rest = parse_paging([("limit", "4"), ("phase", "Ready")], "proxies", 3)
    assert rest == [("phase", "Ready")]
    first = paging.page(KEYS)
    assert (first.keys, first.total) == (KEYS[:4], 10)
    assert first.token
    keys: list[tuple[str, ...]] = list(first.keys)
    token = first.token
    while token:
        paging, _ = parse_paging(
            [("phase", "Ready"), ("limit", "4"), ("continue", token)], "proxies", 3
        )
        page = paging.page(KEYS)
        keys += page.keys
        token = page.token
    assert keys == KEYS
    odd, _ = parse_paging([("limit", "2")], "proxies", 3)
    got = odd.page(KEYS, lambda k: int(k[2][1:]) % 2 == 1)
    assert got.total == 5
    assert got.keys == [KEYS[1], KEYS[3]]
    exact, _ = parse_paging([("limit", "10")], "proxies", 3)
    assert exact.page(KEYS).token == ""  # a last page that is full says so


def test_paging_errors_name_the_field() -> None:
    with pytest.raises(InvalidRequest, match="limit"):
        parse_paging([("limit", "0")], "proxies", 3)
    with pytest.raises(InvalidRequest, match="once"):
        parse_paging([("continue", "a"), ("continue", "b")], "proxies", 3)
    with pytest.raises(InvalidContinue) as caught:
        parse_paging([("continue", "nonsense")], "proxies", 3)
    assert caught.value.status == STATUS[ErrorCode.INVALID_CONTINUE] == 400


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 1500 + b"]" * 1500,  # nested deeper than the JSON parser goes
        b"[" * 2500,
        b'["' + b"x" * 2000 + b'", []]',
        b"null",
        b'{"a": 1}',
        b"\xff\xfe",
    ],
)
def test_a_hostile_token_is_refused_never_a_crash(body: bytes) -> None:
    token = base64.urlsafe_b64encode(bytes([TOKEN_VERSION]) + body).decode().rstrip("=")
    with pytest.raises(BadToken):
        decode_token(token, "proxies", 3)
