"""What the probe client reads of an HTTP/1.1 answer (its head, a chunk's size line), parsed
strictly, and total: any bytes give a value or ``HttpRefused``, never another exception.

Why total: the answer comes from the far side of a proxy, so it is hostile input, and the health
service turns it into a verdict. One ``ValueError`` that escaped (``int(b"-5", 16)`` is -5, and
``readexactly(-3)`` raised) gave no verdict at all, a traceback every check and ``healthy:
null`` (docs/decisions/0136-a-store-is-found-by-what-runs-on-it.md, "The probe's reader").

Why strict: ``int(x, 16)`` also takes ``+5``, ``0x5``, ``1_0`` and spaces, and ``int`` of a long
digit string raises past 4,300 digits; RFC 9112 allows one to sixteen hex digits for a chunk
size and digits for a length, so anything else is refused before a number is made of it.

Pure: bytes in, values out (services/health/probe_client.py does the reading).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_LENGTH_DIGITS = 18
"""A ``Content-Length`` of more digits is beyond any body a probe would read (and ``int`` of
enough digits raises)."""
MAX_CHUNK_DIGITS = 16
"""A chunk size is at most 64 bits of hex."""
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DIGITS = frozenset(b"0123456789")
_WHITESPACE = b" \t"


class HttpRefused(ValueError):
    """Bytes that are not the HTTP/1.1 the probe expects; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class Head:
    """A response head, as much of it as a probe uses."""

    status: int
    keep_alive: bool
    """Whether the connection may carry another request after the body."""
    content_type: str = ""
    length: int | None = None
    chunked: bool = False


def status_of(head: bytes) -> int:
    """The status code of a status line: ``HTTP/x.y`` and three digits, 100 to 599."""
    line = head.split(b"\r\n", 1)[0].split()
    if (
        len(line) < 2
        or not line[0].startswith(b"HTTP/")
        or len(line[1]) != 3
        or not _DIGITS.issuperset(line[1])
        or not 100 <= int(line[1]) <= 599
    ):
        raise HttpRefused(f"not an HTTP response: {head[:60]!r}")
    return int(line[1])


def parse_head(head: bytes) -> Head:
    """The head's status and the headers a probe reads. Two different lengths are refused: the
    body's end would be a guess. A length beside chunked coding is ignored, and the connection
    not reused (RFC 9112, 6.3)."""
    status = status_of(head)
    keep = head[:9] == b"HTTP/1.1 "
    content_type, lengths, chunked = "", set[int](), False
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue  # the blank lines at the end
        name, value = name.strip().lower(), value.strip(_WHITESPACE)
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length":
            lengths.add(_length(value))
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            tokens = value.lower()
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
    if len(lengths) > 1:
        raise HttpRefused(f"the response gives two lengths ({sorted(lengths)[:2]})")
    if chunked and lengths:
        return Head(status, False, content_type, None, chunked)
    return Head(status, keep, content_type, lengths.pop() if lengths else None, chunked)


def _length(value: bytes) -> int:
    if not value or len(value) > MAX_LENGTH_DIGITS or not _DIGITS.issuperset(value):
        raise HttpRefused(f"Content-Length {value[:30]!r} is not a length")
    return int(value)


def chunk_size(line: bytes) -> int:
    """The size of a chunk from its size line (``1a;ext=1\\r\\n``): one to sixteen hex digits,
    then optionally blanks and extensions, which are ignored."""
    if not line.endswith(b"\r\n"):
        raise HttpRefused("a chunk size line without its end")
    digits = line[:-2].split(b";", 1)[0].rstrip(_WHITESPACE)
    if not digits or len(digits) > MAX_CHUNK_DIGITS or not _HEX.issuperset(digits):
        raise HttpRefused(f"bad chunk size {line[:30]!r}")
    return int(digits, 16)
