"""The plumbing every cloud API fake stands on, over real HTTP: faults answered in the order and
number queued, per kind before ``any``; stalls that trip a client's timeout and are released
when the fake stops; replies the clients parse (a 204 without a body, injected headers replacing
the fake's own)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.testing import cloud_http
from services.testing.cloud_http import Fault, Reply, Request

pytestmark = pytest.mark.integration


class Echo(cloud_http.FakeServer):
    """A fake whose call kind is the path: it answers the request back, or a queued fault."""

    def __init__(self) -> None:
        super().__init__(("a", "b", "any"))
        self.seen: list[str] = []

    def serve(self, request: Request) -> Reply:
        kind = request.path.strip("/")
        with self._lock:
            self.seen.append(kind)
        fault = self.fault_for(kind)
        if fault is not None:
            answer = {"code": fault.code, "message": fault.message, "details": fault.details}
            return cloud_http.json_reply(fault.status, answer, fault.headers)
        if kind == "empty":
            return cloud_http.json_reply(204, None)
        own = {"RateLimit-Reset": "60", "X-Kind": kind}
        echo = {
            "kind": kind,
            "method": request.method,
            "params": request.params,
            "auth": request.header("authorization"),
            "body": cloud_http.parse_json(request.body),
        }
        return cloud_http.json_reply(200, echo, own)


@pytest.fixture
def fake() -> Iterator[Echo]:
    with Echo() as server:
        yield server


def call(
    fake: Echo, path: str, *, method: str = "GET", body: bytes = b"", timeout: float = 30.0
) -> tuple[int, dict[str, str], Any]:
    port = int(fake.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body or None, headers={"Authorization": "Bearer t"})
        response = connection.getresponse()
        data = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()
    return response.status, headers, json.loads(data) if data else None


def test_a_request_is_answered_with_its_parts(fake: Echo) -> None:
    status, headers, answer = call(fake, "/a?x=1&x=2&y=3", method="POST", body=b'{"k": "v"}')
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert answer == {
        "kind": "a",
        "method": "POST",
        "params": {"x": "2", "y": "3"},  # a repeated name: the last value
        "auth": "Bearer t",
        "body": {"k": "v"},
    }
    _, _, garbage = call(fake, "/a", method="PUT", body=b"[1, 2")
    assert garbage["body"] == {}  # not a JSON object: read as empty, the fake's checks refuse


def test_faults_answer_in_the_order_and_number_queued(fake: Echo) -> None:
    fake.add_fault("a", Fault(503, "first", "one", remaining=2))
    fake.add_fault("a", Fault(429, "second", "two", details={"n": 1}))
    fake.add_fault("any", Fault(500, "fallback", "any kind"))
    answers = [call(fake, "/a") for _ in range(5)]
    assert [(status, body.get("code")) for status, _, body in answers] == [
        (503, "first"),
        (503, "first"),
        (429, "second"),
        (500, "fallback"),  # a's own queue is empty: the next fault for any kind
        (200, None),
    ]
    assert answers[2][2]["details"] == {"n": 1}


def test_a_fault_for_any_kind_waits_behind_a_kinds_own(fake: Echo) -> None:
    fake.add_fault("any", Fault(500, "fallback"))
    fake.add_fault("b", Fault(404, "own"))
    assert call(fake, "/b")[0] == 404
    assert call(fake, "/a")[0] == 500
    assert call(fake, "/b")[0] == 200


def test_an_unknown_kind_is_refused_naming_the_known_ones(fake: Echo) -> None:
    with pytest.raises(ValueError, match=r"unknown call kind 'c'; use one of a, b, any"):
        fake.add_fault("c", Fault(500, "x"))
    with pytest.raises(ValueError, match="unknown call kind 'c'"):
        fake.stall("c", 1.0)


def test_injected_headers_replace_the_fakes_own_whatever_their_case(fake: Echo) -> None:
    merged = cloud_http.merge_headers(
        {"ratelimit-reset": "60", "X-A": "1"}, {"RateLimit-Reset": "0", "Retry-After": "3"}
    )
    assert merged == {"X-A": "1", "RateLimit-Reset": "0", "Retry-After": "3"}
    fake.add_fault("a", Fault(429, "slow", headers={"retry-after": "30"}))
    status, headers, _ = call(fake, "/a")
    assert (status, headers["retry-after"]) == (429, "30")


def test_a_204_carries_neither_body_nor_length(fake: Echo) -> None:
    status, headers, answer = call(fake, "/empty", method="DELETE")
    assert (status, answer) == (204, None)
    assert "content-length" not in headers
    assert "content-type" not in headers
    assert call(fake, "/a")[0] == 200  # the kept-alive connection's next answer is intact


def test_a_stall_trips_the_clients_timeout_then_the_call_is_answered(fake: Echo) -> None:
    fake.stall("a", 30.0, times=1)
    with pytest.raises(TimeoutError):
        call(fake, "/a", timeout=0.5)
    assert call(fake, "/a")[0] == 200  # only the next one was held
    assert call(fake, "/b", timeout=0.5)[0] == 200  # other kinds never were


def test_a_standing_stall_holds_every_call_of_its_kind(fake: Echo) -> None:
    fake.stall("b", 30.0)
    for _ in range(2):
        with pytest.raises(TimeoutError):
            call(fake, "/b", timeout=0.5)


def test_stopping_releases_a_stalled_call_and_the_fake_starts_again() -> None:
    fake = Echo().start()
    fake.stall("a", 600.0)
    outcome: list[object] = []

    def stalled() -> None:
        try:
            outcome.append(call(fake, "/a", timeout=120.0)[0])
        except OSError as exc:  # the server went away mid-answer: also released
            outcome.append(exc)

    thread = threading.Thread(target=stalled, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30.0
    while "a" not in fake.seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake.seen == ["a"], "the call never reached the fake"
    fake.stop()
    thread.join(timeout=60.0)  # bounded: far below the stall and the client's timeout
    assert not thread.is_alive(), "the stalled call was not released by stop()"
    assert outcome == [200]  # answered once released, as a slow API finally does
    with fake:
        fake.stall("a", 0.0)
        assert call(fake, "/a")[0] == 200
    with pytest.raises(AssertionError, match="start the fake first"):
        _ = fake.url
