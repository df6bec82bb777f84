"""nats-py's client, with a header parser that gives the same answer for far less CPU.

Every message a service receives carries 4 to 10 headers (our envelope, JetStream's sequence,
subject and time stamp), and nats-py's parser tests each character of every header name with a
generator (``any(c.isspace() for c in key)``): in a profile of the reconciler that check alone
was about 5% of its CPU, and the parse 7% (docs/benchmarks.md, "Proxy lifecycle"). This parser
keeps nats-py's rules exactly (skipped lines, names, stripping, decoding), which a test checks
against nats-py's own on arbitrary bytes; only the name check is one C call.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as _NatsClient

_CRLF = b"\r\n"


class Client(_NatsClient):
    """The client every connection of ours uses (services and CLI alike)."""

    async def _flusher(self) -> None:
        """nats-py's flusher, which lets every task ready now add its messages before it writes.

        nats-py wakes its flusher on the first message queued and writes at once, so a service
        answering many messages concurrently made one ``write`` system call per message or two:
        in a profile of the reconciler the socket writes were a quarter of its CPU. Yielding
        once to the event loop first lets the tasks already runnable queue theirs, and one
        call writes them all; the wait is one turn of the loop, never a timer.
        """
        assert self._transport, "Client.connect must be called first"
        assert self._flush_queue, "Client.connect must be called first"
        while True:
            if not self.is_connected or self.is_connecting:
                break
            future: asyncio.Future[None] = await self._flush_queue.get()
            try:
                await asyncio.sleep(0)
                if self._pending_data_size > 0:
                    self._transport.writelines(self._pending[:])
                    self._pending = []
                    self._pending_data_size = 0
                    await self._transport.drain()  # type: ignore[no-untyped-call]
            except OSError as e:
                await self._error_cb(e)
                await self._process_op_err(e)
                break
            except (asyncio.CancelledError, RuntimeError, AttributeError):
                break  # RuntimeError: the event loop is closed
            finally:
                if not future.done():  # it may have been cancelled
                    future.set_result(None)

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
