"""The probe client's HTTP reader is total: whatever bytes come back through a proxy, it gives a
status or a refusal the health service turns into a verdict, never another exception
(services/health/pure/http1.py; docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md).
A negative chunk size once escaped as ``ValueError`` from ``readexactly``: no verdict, a
traceback every check. tests/integration/test_probe_hostile_tls.py sends it over real TLS."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from services.health import probe_client
from services.health.probe_client import ProbeError
from services.health.pure.http1 import HttpRefused, chunk_size, parse_head, status_of

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: "

# Answers that reach every part of the reader: arbitrary bytes, and arbitrary bytes after a head
# that announces chunks or a length, with chunk size lines of any text.
size_lines = st.lists(
    st.tuples(
        st.from_regex(rb"\A[-+ 0-9a-fxA-F_;=]{0,20}\Z"),
        st.binary(max_size=40),
    ),
    max_size=4,
).map(lambda pairs: b"".join(line + b"\r\n" + data for line, data in pairs))
answers = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda tail: CHUNKED + tail, size_lines),
    st.builds(lambda tail: CHUNKED + tail, st.binary(max_size=200)),
    st.builds(lambda n, tail: LENGTH + n + b"\r\n\r\n" + tail, st.binary(max_size=30), st.binary()),
)


def read(answer: bytes, how: str) -> object:
    """``answer`` read as a probe (``response``) or an echo fetch (``chunked`` body) reads it."""

    async def run() -> object:
        reader = asyncio.StreamReader(limit=4096)
        reader.feed_data(answer)
        reader.feed_eof()
        if how == "response":
            return await probe_client._read_response(reader, reused=False)
        head = await probe_client._read_head(reader, reused=True)
        return await probe_client._read_chunked(reader, keep=64) if head.chunked else head

    return asyncio.run(run())


@settings(max_examples=300, deadline=None)
@given(answer=answers, how=st.sampled_from(["response", "chunked"]))
@example(answer=CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", how="response")
@example(answer=CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", how="chunked")
@example(answer=LENGTH + b"1" * 5000 + b"\r\n\r\n", how="response")
def test_any_answer_is_a_status_or_a_refusal(answer: bytes, how: str) -> None:
    # A verdict: protocol_error, or connection_lost for an answer cut short.
    with contextlib.suppress(ProbeError, probe_client._Stale, asyncio.IncompleteReadError):
        read(answer, how)


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200))
def test_the_parsers_give_a_value_or_a_refusal(data: bytes) -> None:
    for parse in (status_of, parse_head, chunk_size):
        with contextlib.suppress(HttpRefused):
            parse(data)


@pytest.mark.parametrize(
    "line",
    [b"-5\r\n", b"+5\r\n", b"0x5\r\n", b"1_0\r\n", b" 5\r\n", b"\r\n", b"5", b"1" * 17 + b"\r\n"],
)
def test_a_chunk_size_is_hex_digits_only(line: bytes) -> None:
    with pytest.raises(HttpRefused, match="chunk size"):
        chunk_size(line)


def test_a_chunk_size_may_carry_extensions() -> None:
    assert chunk_size(b"1a;name=value\r\n") == 26
    assert chunk_size(b"1A \t;x\r\n") == 26
    assert chunk_size(b"0\r\n") == 0


def test_a_negative_chunk_size_is_a_protocol_error() -> None:
    with pytest.raises(ProbeError) as refused:
        read(CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", "response")
    assert refused.value.outcome == "protocol_error"
    assert "bad chunk size" in str(refused.value)


@pytest.mark.parametrize(
    ("head", "problem"),
    [
        (b"HTTP/1.1 2000 OK\r\n\r\n", "not an HTTP response"),
        (b"HTTP/1.1 -20 OK\r\n\r\n", "not an HTTP response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "not a length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", "not a length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "two lengths"),
    ],
)
def test_a_head_is_refused_naming_what_is_wrong(head: bytes, problem: str) -> None:
    with pytest.raises(HttpRefused, match=problem):
        parse_head(head)


def test_a_length_beside_chunks_is_ignored_and_the_connection_not_kept() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert (head.chunked, head.length, head.keep_alive) == (True, None, False)
