"""nats-py's client, with a header parser that gives the same answer for far less CPU.

Every message a service receives carries 4 to 10 headers (our envelope, JetStream's sequence,
subject and time stamp), and nats-py's parser tests each character of every header name with a
generator (``any(c.isspace() for c in key)``): in a profile of the reconciler that check alone
was about 5% of its CPU, and the parse 7% (docs/benchmarks.md, "Proxy lifecycle"). This parser
keeps nats-py's rules exactly (skipped lines, names, stripping, decoding), which a test checks
against nats-py's own on arbitrary bytes; only the name check is one C call.
"""

from __future__ import annotations

from nats.aio.client import Client as _NatsClient

_CRLF = b"\r\n"


class Client(_NatsClient):
    """The client every connection of ours uses (services and CLI alike)."""

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(_CRLF):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            try:
                key = name.strip().decode("ascii")
            except UnicodeDecodeError:
                continue
            # Whitespace inside a name: nats-py skips the line. ``str.split`` splits on exactly
            # the characters ``str.isspace`` accepts, so a name without any splits to itself.
            if key and key.split() != [key]:
                continue
            out[key] = value.strip().decode("utf-8", "replace")
        return out
