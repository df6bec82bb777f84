"""What the chaos soak's hostile client sends at the proxy edge (bench.chaos_edge): the
credentials it can forge from a lease id alone, and requests whose targets never leave this
machine."""

from __future__ import annotations

import base64

from bench.chaos_edge import Endpoint, escapes, forged_credentials, get


def test_a_lease_url_gives_the_proxy_and_its_decoded_credential() -> None:
    endpoint = Endpoint.of("http://lease%2D1:p%40ss@127.0.0.1:3128")
    assert endpoint == Endpoint("127.0.0.1", 3128, b"lease-1:p@ss")
    assert Endpoint.of("http://127.0.0.1") is None, "no port: nothing to send to"
    assert Endpoint.of("http://[::1:3128") is None, "a broken URL is skipped, not raised"


def test_forged_credentials_carry_the_lease_id_and_nothing_the_holder_has() -> None:
    forged = forged_credentials("lease-1")
    assert len(forged) == len(set(forged)) >= 3
    assert all(c.startswith(b"lease-1") for c in forged)
    assert forged_credentials("lease-1") != forged, "made-up parts are new each time"


def test_a_forged_request_sends_its_credential_as_basic() -> None:
    request = get("127.0.0.1:8080", b"lease-1:x")
    assert request.startswith(b"GET http://127.0.0.1:8080/ HTTP/1.1\r\n")
    assert b"Proxy-Authorization: Basic " + base64.b64encode(b"lease-1:x") in request
    assert request.endswith(b"\r\n\r\n")


def test_every_escape_names_this_machine_or_a_name_that_cannot_resolve() -> None:
    for name, head in escapes(9000).items():
        target = head.split(b" ")[1]
        assert target.startswith(
            (b"127.0.0.1:", b"[::ffff:127.0.0.1]:", b"http://0.0.0.0:", b"http://metadata.")
        ), name
