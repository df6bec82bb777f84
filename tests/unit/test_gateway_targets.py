"""A connection's target cache (``wire.Targets``): the same URL again is answered from it, and
a URL the gateway refuses is refused every time, whatever came before it."""

from __future__ import annotations

import pytest

from services.gateway.pure.heads import HeadError
from services.gateway.wire import Targets

OWN = (8000,)


def test_the_same_url_again_is_the_same_target() -> None:
    cache = Targets()
    first = cache.get("GET", b"http://shop.example/a", OWN)
    assert cache.get("GET", b"http://shop.example/a", OWN) is first
    assert cache.get("GET", b"http://shop.example/b?q=1", OWN) is first  # same authority
    other = cache.get("GET", b"http://shop.example:8080/a", OWN)
    assert (other[0].host, other[0].port) == ("shop.example", 8080)


@pytest.mark.parametrize(
    "url", [b"http://user@shop.example/a", b"/a", b"ftp://shop.example/a", b"http://[::1/"]
)
def test_a_refused_url_stays_refused_after_a_good_one(url: bytes) -> None:
    cache = Targets()
    cache.get("GET", b"http://shop.example/a", OWN)
    for _ in range(2):
        with pytest.raises(HeadError):
            cache.get("GET", url, OWN)
    assert cache.get("GET", b"http://shop.example/a", OWN)[0].host == "shop.example"


def test_the_gateway_s_own_port_is_denied_each_time() -> None:
    cache = Targets()
    for _ in range(2):
        _, why = cache.get("GET", b"http://127.0.0.1:8000/", OWN)
        assert why is not None
    assert cache.get("CONNECT", b"127.0.0.1:8000", OWN)[1] is not None
    assert cache.get("GET", b"http://127.0.0.1:8001/", OWN)[1] is None
