"""The echo answer: the address forms echo services answer with, and every bad answer refused
with one line that names the fault and the fix (services/health/pure/echo.py)."""

from __future__ import annotations

import ipaddress
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.pure.echo import (
    ECHO_BODY_LIMIT,
    FIX,
    SCOPE_PRIVATE,
    SCOPE_PUBLIC,
    EchoAnswer,
    parse_echo,
    scope_of,
)

TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def refused(answer: EchoAnswer) -> str:
    """The error of a refused answer, checked to be one line that ends with the fix."""
    assert answer.ip == ""
    assert answer.scope == ""
    assert answer.error.endswith(FIX)
    assert "\n" not in answer.error
    return answer.error


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"203.0.113.7", TEXT),
        (b"203.0.113.7\n", TEXT),
        (b"  \r\n203.0.113.7 \r\n", ""),
        (b"\xef\xbb\xbf203.0.113.7", TEXT),
        (b'{"ip": "203.0.113.7"}', JSON),
        (b'{"ip": " 203.0.113.7 ", "country": "DE"}', "text/plain"),
        (b'{"origin": "203.0.113.7"}', JSON),
        (b'{"origin": "203.0.113.7, 10.0.0.1"}', JSON),
        (b"::ffff:203.0.113.7", TEXT),
        (b"::FFFF:CB00:7107", TEXT),
    ],
)
def test_public_ipv4_forms(body: bytes, content_type: str) -> None:
    assert parse_echo(200, content_type, body) == EchoAnswer(ip="203.0.113.7", scope=SCOPE_PUBLIC)


@pytest.mark.parametrize(
    ("body", "ip"),
    [
        (b"2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
        (b"2001:0db8:0000:0000:0000:ff00:0042:8329\n", "2001:db8::ff00:42:8329"),
        (b'{"ip": "2A01:4F8::1"}', "2a01:4f8::1"),
    ],
)
def test_ipv6_is_normalised_to_its_compressed_form(body: bytes, ip: str) -> None:
    assert parse_echo(200, TEXT, body) == EchoAnswer(ip=ip, scope=SCOPE_PUBLIC)


def test_any_2xx_is_an_answer() -> None:
    assert parse_echo(203, TEXT, b"8.8.8.8").ip == "8.8.8.8"


PRIVATE = ["10.1.2.3", "192.168.0.9", "127.0.0.1", "169.254.1.1", "100.64.0.1", "0.0.0.0"]
PRIVATE += ["::1", "fd00::5", "fe80::1", "fec0::1", "224.0.0.1", "240.0.0.1", "::ffff:10.0.0.1"]


@pytest.mark.parametrize("address", PRIVATE)
def test_a_private_address_is_kept_and_marked_private(address: str) -> None:
    """The proxy's traffic left from an address nobody outside can see: the caller judges that,
    so the address is kept rather than refused."""
    answer = parse_echo(200, TEXT, address.encode())
    assert answer.scope == SCOPE_PRIVATE
    assert answer.error == ""
    assert answer.ip == str(ipaddress.ip_address(answer.ip))


@pytest.mark.parametrize(
    "address", ["192.0.2.1", "198.51.100.200", "203.0.113.255", "2001:db8:ffff::1", "8.8.8.8"]
)
def test_documentation_ranges_count_as_public(address: str) -> None:
    assert scope_of(ipaddress.ip_address(address)) == SCOPE_PUBLIC


@pytest.mark.parametrize("status", [404, 500, 302, 101, 0, -1, 999])
def test_a_status_outside_2xx_is_refused_naming_it(status: int) -> None:
    error = refused(parse_echo(status, TEXT, b"203.0.113.7"))
    assert f"HTTP {status}" in error
    assert "--egress-echo-url" in error
    assert "spec.egressCheck.url" in error


def test_404_reads_as_one_sentence_with_the_fix() -> None:
    assert parse_echo(404, "text/html", b"Not Found").error == (
        "the echo URL answered HTTP 404; set --egress-echo-url (or spec.egressCheck.url) "
        "to a URL that answers the caller's address"
    )


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html; charset=utf-8", b"203.0.113.7"),
        ("", b"<!DOCTYPE html><html><body>203.0.113.7</body></html>"),
        (TEXT, b"\n  <html>"),
    ],
)
def test_html_is_refused(content_type: str, body: bytes) -> None:
    assert "HTML" in refused(parse_echo(200, content_type, body))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "empty body"),
        (b" \n\t ", "empty body"),
        (b"hello", "not an IP address"),
        (b"203.0.113.7 198.51.100.1", "more than one word"),
        (b"203.0.113.7\n198.51.100.1", "more than one word"),
        (b"203.0.113.007", "not an IP address"),
        (b"203.0.113", "not an IP address"),
        (b"fe80::1%eth0", "zone"),
        (b"203.0.113.7:8080", "port"),
        (b"[2001:db8::1]:443", "port"),
        (b"\xff\xfe2\x000\x003\x00", "not UTF-8"),
        (b"\x1b[31m203.0.113.7", "not an IP address"),
    ],
)
def test_garbage_is_refused_naming_the_fault(body: bytes, says: str) -> None:
    assert says in refused(parse_echo(200, TEXT, body))


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'"203.0.113.7"', "JSON string"),
        (b'["203.0.113.7"]', "JSON array"),
        (b"null", "JSON null"),
        (b"7", "JSON number"),
        (b"{}", 'without "ip"'),
        (b'{"address": "203.0.113.7"}', 'without "ip"'),
        (b'{"ip": 7}', '"ip" is not a string'),
        (b'{"ip": null}', 'without "ip"'),
        (b'{"origin": ["203.0.113.7"]}', '"origin" is not a string'),
        (b'{"ip": "nope"}', "not an IP address"),
        (b'{"ip": "203.0.113.7"', "invalid JSON"),
        (b"[" * 3000, "nested too deep"),
    ],
)
def test_json_without_an_address_is_refused(body: bytes, says: str) -> None:
    assert says in refused(parse_echo(200, JSON, body))


def test_a_control_character_is_quoted_not_echoed() -> None:
    """The body comes from beyond the proxy: it must not write escapes into a log line."""
    error = refused(parse_echo(200, TEXT, b"\x1b]0;owned\x07"))
    assert "\x1b" not in error
    assert "\\x1b" in error


def test_an_oversized_body_is_refused_saying_so() -> None:
    body = b"203.0.113.7" + b" " * ECHO_BODY_LIMIT
    error = refused(parse_echo(200, TEXT, body))
    assert f"more than {ECHO_BODY_LIMIT} bytes" in error


def test_a_body_at_the_limit_is_read() -> None:
    body = b"203.0.113.7".ljust(ECHO_BODY_LIMIT, b" ")
    assert parse_echo(200, TEXT, body).ip == "203.0.113.7"


ADDRESSES = st.ip_addresses().map(str)
BODIES = st.one_of(
    st.binary(max_size=ECHO_BODY_LIMIT + 16),
    st.text(max_size=64).map(str.encode),
    ADDRESSES.map(str.encode),
    ADDRESSES.map(lambda ip: json.dumps({"ip": ip}).encode()),
    st.lists(ADDRESSES, min_size=1, max_size=3).map(
        lambda ips: json.dumps({"origin": ", ".join(ips)}).encode()
    ),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8) | ADDRESSES,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
        max_leaves=8,
    ).map(lambda value: json.dumps(value).encode()),
)
CONTENT_TYPES = st.one_of(st.sampled_from([TEXT, JSON, "text/html", ""]), st.text(max_size=30))


@given(st.integers(), CONTENT_TYPES, BODIES)
def test_never_raises_and_an_address_round_trips(
    status: int, content_type: str, body: bytes
) -> None:
    answer = parse_echo(status, content_type, body)
    if answer.ip:
        assert answer.error == ""
        assert answer.scope in {SCOPE_PUBLIC, SCOPE_PRIVATE}
        assert str(ipaddress.ip_address(answer.ip)) == answer.ip
    else:
        refused(answer)


@given(ADDRESSES)
def test_every_address_is_accepted_as_text_and_json(address: str) -> None:
    expected = ipaddress.ip_address(address)
    if isinstance(expected, ipaddress.IPv6Address) and expected.ipv4_mapped is not None:
        expected = expected.ipv4_mapped
    want = EchoAnswer(ip=str(expected), scope=scope_of(expected))
    assert parse_echo(200, TEXT, address.encode()) == want
    assert parse_echo(200, JSON, json.dumps({"ip": address}).encode()) == want
