"""nats-py's client, with a header parser that gives the same answer for far less CPU.

Every message a service receives carries 4 to 10 headers (our envelope, JetStream's sequence,
subject and time stamp), and nats-py's parser tests each character of every header name with a
generator (``any(c.isspace() for c in key)``): in a profile of the reconciler that check alone
was about 5% of its CPU, and the parse 7% (docs/benchmarks.md, "Proxy lifecycle"). This parser
keeps nats-py's rules exactly (skipped lines, names, stripping, decoding), which a test checks
against nats-py's own on arbitrary bytes; only the name check is one C call.

A pull consumer's ``fetch`` takes each message of a batch with ``next_msg``, which starts two
tasks and makes a uuid for every message, even one already queued: about a tenth of the
reconciler's CPU (docs/decisions/0165-deliveries-settled-inline.md). Our subscriptions hand
out a queued message at once and wait the nats-py way only when none is queued.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as _NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

_CRLF = b"\r\n"


class QueuedFirst(Subscription):
    """nats-py's subscription, whose ``next_msg`` returns a message already queued without a
    task (the same message, with the same bookkeeping, nats-py's would return)."""

    async def next_msg(self, timeout: float | None = 1.0) -> Msg:
        queue: asyncio.Queue[Msg] = self._pending_queue
        if self._cb or self._conn.is_closed or queue.empty():
            return await super().next_msg(timeout)  # its errors, or its wait
        msg = queue.get_nowait()
        self._pending_size -= len(msg.data)
        queue.task_done()
        return msg


class Client(_NatsClient):
    """The client every connection of ours uses (services and CLI alike)."""

    async def subscribe(self, *args: Any, **kwargs: Any) -> Subscription:
        sub = await super().subscribe(*args, **kwargs)
        if type(sub) is Subscription:
            # Same layout, one method more: nats-py makes its subscriptions in ``subscribe``
            # itself, with no way to pass a class.
            sub.__class__ = QueuedFirst
        return sub

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
