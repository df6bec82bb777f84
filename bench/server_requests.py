"""What the services ask of the nats-server, counted by kind from outside the services.

A connection subscribed to ``>`` sees every message published in the account: the services'
appends, their JetStream API requests (pulls, direct gets, KV puts), their acks, and the server's
answers and deliveries to inboxes. Counting those per proxy tells where the server's work comes
from without touching the services' code. The subscription doubles what the server delivers, so
a run that counts is not a run whose CPU figures count: the benchmarks count in a run of their own.
"""

from __future__ import annotations

import json
from collections import Counter

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

ACK_KINDS = {
    b"": "ack",
    b"+ACK": "ack",
    b"-NAK": "nak",
    b"+NXT": "ack+next",
    b"+WPI": "in progress",
}


SERVICES = ("reconciler", "executor")
"""Durables named in the counts; any other consumer is a reader of the benchmark's own."""


def consumer(name: str) -> str:
    return name if name in SERVICES else "the benchmark's readers"


def kind(subject: str, reply: str, data: bytes, headers: dict[str, str] | None) -> str:
    """The kind of one message: which request, which append, which answer."""
    tokens = subject.split(".")
    if reply.startswith("$JS.ACK."):
        # A consumer's delivery: JetStream keeps the stream subject, the reply names the consumer.
        return f"delivery to {consumer(reply.split('.')[3]) if reply.count('.') > 3 else '?'}"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return f"pull {consumer(tokens[-1])}"
    if subject.startswith("$JS.API.DIRECT.GET."):
        if len(tokens) > 5:
            return "direct get last by subject"
        try:
            asked = json.loads(data or b"{}")
        except ValueError:
            return "direct get (unreadable)"
        keys = sorted(asked) if isinstance(asked, dict) else []
        shape = "multi_last" if "multi_last" in keys else "batch" if "batch" in keys else "seq"
        return f"direct get {shape}"
    if subject.startswith("$JS.API."):
        return "api " + ".".join(tokens[2:4])
    if subject.startswith("$JS.ACK."):
        first = data.split(b" ", 1)[0]
        name = ACK_KINDS.get(first, "nak delayed" if first.startswith(b"-NAK") else "ack other")
        return f"{name} {consumer(tokens[3]) if len(tokens) > 3 else '?'}"
    if subject.startswith("$JS.EVENT."):
        return "advisory " + ".".join(tokens[3:5])
    if subject.startswith("$KV."):
        return f"kv put {tokens[1] if len(tokens) > 1 else '?'}"
    if subject.startswith("_INBOX."):
        return "answer: " + answer(data, headers)
    if tokens[0] == "proxy" and len(tokens) == 3:
        return f"append proxy.*.{tokens[2]}"
    return f"publish {tokens[0]}"


def answer(data: bytes, headers: dict[str, str] | None) -> str:
    """What the server answered into an inbox."""
    hdrs = headers or {}
    if "Nats-Sequence" in hdrs:
        return "a message read (direct get)"
    status = hdrs.get("Status", "")
    if status:
        return f"status {status} {hdrs.get('Description', '')}".strip()
    if data.startswith(b'{"stream"'):
        return "publish ack"
    return "other" if data else "empty"


class RequestCounter:
    """Counts by kind every message of the account while it is subscribed."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._sub: Subscription | None = None

    async def start(self, nc: Client) -> None:
        async def count(msg: Msg) -> None:
            self.counts[kind(msg.subject, msg.reply, msg.data, msg.headers)] += 1

        self._sub = await nc.subscribe(">", cb=count, pending_msgs_limit=1_000_000)

    async def stop(self) -> dict[str, int]:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        return dict(self.counts.most_common())
