"""A request's ``target`` names a host or is refused with the rule (D139): what a crawler sends
is kept, what names no host (markup, spaces, credentials, a malformed address) never reaches the
log. Whatever the text, the check answers a host or a ValueError, never anything else."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections.outcomes import target_key
from services.discovery.pure.targets import MAX_HOST, check_target

ACCEPTED = {
    "shop.example.com": "shop.example.com",
    "Shop.Example.COM.": "shop.example.com",
    "shop.example.com:8443": "shop.example.com",
    "https://shop.example.com/cart?id=1&x=%41#top": "shop.example.com",
    "HTTP://shop.example.com": "shop.example.com",
    "bücher.example": "bücher.example",
    "203.0.113.7": "203.0.113.7",
    "http://[2001:db8::1]:8080/": "2001:db8::1",
    "localhost": "localhost",
    "": "",
}

REFUSED = {
    "xsshost<svg>.example": "names no host",
    "https://shop.example/<svg/onload=alert(1)>": "percent-encode",
    "shop example.com": "space or a control",
    "shop.example.com\x01": "space or a control",
    "http://user:secret@shop.example.com/": "user or password",
    "ftp://shop.example.com": "http or https",
    "javascript://shop.example.com": "http or https",
    "shop.example.com:99999": "port",
    "a..example": "names no host",
    "-shop.example": "names no host",
    "shop_1.example": "names no host",
    "0177.0.0.1": "no IPv4 address",
    "1.2.3": "no IPv4 address",
    "http://[zz::1]/": "IPv6",
    "shop.123": "not all digits",
    ("a" * 63 + ".") * 4 + "example": f"at most {MAX_HOST}",
    "a" * 64 + ".example": "names no host",
    "http:///path": "names no host",
}


@pytest.mark.parametrize(("target", "host"), ACCEPTED.items())
def test_a_host_or_a_url_of_one_is_accepted(target: str, host: str) -> None:
    assert check_target(target) == host
    assert check_target(target) == target_key(target)  # the back-off key stays the same


@pytest.mark.parametrize(("target", "why"), REFUSED.items())
def test_anything_that_names_no_host_is_refused_with_the_rule(target: str, why: str) -> None:
    with pytest.raises(ValueError, match="send a host name") as raised:
        check_target(target)
    assert why in str(raised.value)


@given(st.text(max_size=300))
def test_any_text_is_a_host_or_a_refusal(text: str) -> None:
    try:
        host = check_target(text)
    except ValueError:
        return
    if not host:
        assert not text.strip()
        return
    assert len(host) <= MAX_HOST
    assert "<" not in host
    assert ">" not in host
    assert " " not in host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        for label in host.encode("idna").decode("ascii").split("."):
            assert 1 <= len(label) <= 63
            assert label.replace("-", "").isalnum()
            assert label.isascii()
