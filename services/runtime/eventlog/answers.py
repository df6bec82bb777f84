"""The JetStream store's one reply subscription: every answer it waits for comes back there.

A read's direct get is answered by its messages and a status message that ends them; an append
by the stream's acknowledgement. Both wait on a future that the subscription's callback
completes, with one timeout per request: the reader wakes once per request, not once per
message. Appends came through nats-py's ``js.publish`` before, which made an inbox token and a
``wait_for`` per request and read the answer with ``json.loads`` into a dataclass
(docs/decisions/0165-deliveries-settled-inline.md); an answer that is not the stream's JSON is an
error of the append, never a crash of the service.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from events.errors import EventStoreError, StoreUnavailable


class ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""

    @property
    def described(self) -> str:
        return f"{self.description} (code {self.code}, error code {self.err_code})"


class PubAck(msgspec.Struct, frozen=True):
    """A stream's answer to a publish: where it stored it, or why it did not."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: ApiError | None = None


_ACKS = msgspec.json.Decoder(PubAck)
REFUSED = frozenset({"408", "413"})


class Refused(StoreUnavailable):
    """The server refused the request itself (408 bad request, 413 too many subjects)."""


class Answers:
    def __init__(self, nc: NATS, timeout: float) -> None:
        self._nc = nc
        self._timeout = timeout
        self._inbox = ""
        self._reads: dict[str, _Read] = {}
        self._acks: dict[str, asyncio.Future[Msg]] = {}
        self._next = 0
        self._lock = asyncio.Lock()

    async def acknowledged(self, subject: str, payload: bytes, headers: dict[str, str]) -> PubAck:
        """Publish and wait for the stream's acknowledgement. Raises ``TimeoutError`` without
        an answer in time, ``NoRespondersError`` when no stream takes the subject,
        ``EventStoreError`` for an answer that is not an acknowledgement."""
        token = await self._token()
        answer: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._acks[token] = answer
        try:
            await self._nc.publish(
                subject, payload, reply=f"{self._inbox}.{token}", headers=headers
            )
            async with asyncio.timeout(self._timeout):
                msg = await answer
        finally:
            self._acks.pop(token, None)
        if msg.headers and msg.headers.get("Status") == "503":
            raise nats.errors.NoRespondersError
        try:
            return _ACKS.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise EventStoreError(f"append to {subject}: unreadable acknowledgement") from exc

    async def direct_get(
        self, stream: str, request: dict[str, Any]
    ) -> tuple[list[Msg], int, Mapping[str, str] | None]:
        """One direct get: the messages, how many more match, and the end-of-batch headers
        (``None`` when the server found nothing)."""
        token = await self._token()
        read = _Read()
        self._reads[token] = read
        try:
            await self._nc.publish(
                f"$JS.API.DIRECT.GET.{stream}",
                json.dumps(request).encode(),
                reply=f"{self._inbox}.{token}",
            )
            try:
                async with asyncio.timeout(self._timeout):
                    end = await read.end
            except TimeoutError as exc:
                raise StoreUnavailable(f"read of {stream} timed out") from exc
        finally:
            self._reads.pop(token, None)
        headers = end.headers or {}
        status = headers.get("Status")
        if status == "204":
            return read.msgs, int(headers.get("Nats-Num-Pending", "0")), headers
        if status == "404":
            return read.msgs, 0, None
        if status == "503":
            # "No responders": nothing serves direct gets for this stream. Most often it does not
            # exist yet; in a cluster, its leader may be moving.
            raise StoreUnavailable(
                f"stream {stream} does not answer reads: create it with "
                "`egress-proxies streams init` (or wait for its cluster to elect a leader)"
            )
        description = headers.get("Description", "").strip()
        error = Refused if status in REFUSED else StoreUnavailable
        raise error(f"read of {stream} failed: {status} {description}".strip())

    async def _token(self) -> str:
        """A reply token of its own, the subscription made on first use."""
        if not self._inbox:
            async with self._lock:
                if not self._inbox:
                    inbox = self._nc.new_inbox()
                    await self._nc.subscribe(f"{inbox}.*", cb=self._route)
                    self._inbox = inbox
        token = str(self._next)
        self._next += 1
        return token

    async def _route(self, msg: Msg) -> None:
        token = msg.subject.rsplit(".", 1)[-1]
        ack = self._acks.pop(token, None)
        if ack is not None:
            if not ack.done():
                ack.set_result(msg)
            return
        read = self._reads.get(token)
        if read is None or read.end.done():
            return
        if msg.headers and "Status" in msg.headers:
            read.end.set_result(msg)
        else:
            read.msgs.append(msg)


class _Read:
    """The answer to one direct get as it arrives: messages, then the status that ends it."""

    __slots__ = ("end", "msgs")

    def __init__(self) -> None:
        self.msgs: list[Msg] = []
        self.end: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
