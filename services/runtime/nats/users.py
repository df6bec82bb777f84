"""The NATS users and what each may do: one per service, allowed to publish only the subjects
that service writes (docs/architecture.md, "Streams"), a read-only ``reader`` for operators and
``admin`` for repairs. Only the system writes the log, so a buggy or hostile client of one service
cannot put events where another service's decisions come from.

Pure: the embedded server (``nats.server``) and the bundled configurations (nats.conf, the Helm
values) are written from this table, and the tests derive each service's grants from the code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from services.runtime.eventlog.streams import STREAMS

ADMIN = "admin"
"""The operator's user for repairs (and the CLI's default): no restrictions."""

READER = "reader"
"""The operator's everyday user for the ``nats`` CLI: reads every stream, consumer and bucket,
and can neither write nor delete, purge, edit or reset anything
(docs/decisions/0077-operators-read-the-log-as.md)."""

WRITES: Mapping[str, tuple[str, ...]] = {
    # `pool.*.declared` for the ProxyPools it declares, scales and deletes; `rotate` for the
    # fresh instance a member gets when its Proxy object is deleted by hand.
    "watcher": ("proxy.*.declared", "pool.*.declared", "proxy.*.rotate"),
    # `declared` for ProxyRemoved, the end of a deletion it decides; `lease.*` for the switch
    # of a lease to a rotation's replacement (LeaseSwitched,
    # docs/decisions/0085-a-fresh-ip-without-downtime.md).
    "reconciler": ("proxy.*.cmd", "proxy.*.status", "proxy.*.declared", "lease.*"),
    # `meter` for the bytes through upstream proxies it reads from their Squids' logs
    # (docs/decisions/0161-metering-upstream-bytes.md).
    "executor": ("proxy.*.instance", "meter.*"),
    # `egress` for what a site sees of each proxy; `rotate` for the replacement of one whose
    # egress does not match (spec.egress.onMismatch: replace,
    # docs/decisions/0111-verified-egress.md).
    "health": ("proxy.*.health", "proxy.*.egress", "proxy.*.rotate"),
    "gc": ("gc.*",),
    # `rotate` for RotationRequested, a lease holder's ask for a fresh instance (D85); `demand`
    # for the lease requests naming a pool that it could not serve (docs/pools.md, "Autoscale").
    "discovery": ("lease.*", "proxy.*.rotate", "demand.*"),
    # Its decisions and a deleted pool's end on the pool's subjects; its members' declarations
    # and their rotations (a fresh instance for an aged or blocked member) on theirs
    # (docs/architecture.md, "Pools").
    "pools": ("pool.*.decision", "pool.*.declared", "proxy.*.declared", "proxy.*.rotate"),
    # Its traffic records (docs/decisions/0158-traffic-records.md); it leases through the
    # discovery API with each crawler's token (docs/gateway.md), never on the lease stream.
    "gateway": ("traffic.*",),
}
"""The subjects of the log each service appends to; a service's user is named after it."""

CONSUMERS: Mapping[str, str] = {"reconciler": "PROXY", "executor": "PROXY"}
"""Services with a durable consumer loop, named after the service, on this stream: they ack its
messages and dead-letter to ``deadletter.<service>``."""

KV_BUCKETS: Mapping[str, str] = {
    "health": "egress-health-members",
    "gc": "egress-gc-lock",
    "discovery": "egress-discovery-views",
    "reconciler": "egress-reconciler-states",
}
"""The KV bucket each service keeps (health's replica members, gc's sweep lock, discovery's
snapshots of its views, the reconciler's proxy states to fold on from)."""

CHECKPOINT_BUCKETS: Mapping[str, str] = {
    "PROXY": "egress-checkpoints-proxy",
    "LEASE": "egress-checkpoints-lease",
    "POOL": "egress-checkpoints-pool",
}
"""Per stream, the KV bucket of its time-travel checkpoints: discovery writes them, and anyone
who reads the log reads them (``services.runtime.eventlog.checkpoints``). One bucket per stream,
so each keeps them as long as its stream keeps its events."""
CHECKPOINT_WRITER = "discovery"
CHECKPOINT_LOCK = "egress-checkpoints-lock"
"""The KV bucket of the writer's lock, a key per stream: one discovery replica writes a stream's
checkpoints, the others wait to take over (docs/decisions/0163-checkpoints-as-deltas.md)."""

USERS: tuple[str, ...] = (ADMIN, READER, *WRITES)

READS: tuple[str, ...] = (
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.CREATE.*.*",
    "$JS.API.CONSUMER.CREATE.*.*.>",
    "$JS.API.CONSUMER.INFO.*.*",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
    "$JS.API.CONSUMER.DELETE.*.*",
)
"""The JetStream API every service uses to read: stream info at start-up, direct gets, and pull
and push consumers created under a name in the subject (nats-py names its ephemeral ones at
random; the push follower names its own), so ``durable_denies`` can keep each service off the
other services' durables. Neither the legacy ``CONSUMER.CREATE.<stream>``, whose body may name
any consumer and update it (docs/decisions/0093-each-service-s-durable.md), nor
``CONSUMER.DURABLE.CREATE``. Consumer info stays open to all: discovery reports every durable's
position, and a configuration is no secret."""

READER_READS: tuple[str, ...] = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.INFO.*.*",
    "$JS.API.CONSUMER.CREATE.*.*",
    "$JS.API.CONSUMER.CREATE.*.*.>",
    "$JS.API.CONSUMER.MSG.NEXT.*.*",
    "$JS.API.CONSUMER.DELETE.*.*",
    "$JS.ACK.>",
)
"""What the ``nats`` CLI needs to read (``stream ls/info/get/view``, ``sub --stream``, ``consumer
ls/info``): the listings, stream and consumer info, single messages, and the consumers ``sub``
and ``view`` create under a name of their own (``sub``: a random one, no acks, gone after 5 s
idle; ``view``: ``stream_pager_<n>``, which it acks and deletes when done). Neither the legacy
``CONSUMER.CREATE.<stream>`` nor ``DURABLE.CREATE``: only a name in the subject can be denied."""


def durable_denies(own: str = "") -> list[str]:
    """What ``READS`` or ``READER_READS`` would let a user do to the durables of the services
    other than ``own``, by name: create a consumer under it (an update: its filter, ack wait,
    inactive threshold), pull from it (taking messages the service then waits an ack wait for),
    ack for it (the service would never see those messages) or delete it (the service would
    start again from the first event). NATS applies a deny over any allow."""
    denied = []
    for durable in CONSUMERS:
        if durable == own:
            continue
        denied += [
            f"$JS.API.CONSUMER.CREATE.*.{durable}",
            f"$JS.API.CONSUMER.CREATE.*.{durable}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.*.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.*.{durable}",
            f"$JS.API.CONSUMER.DELETE.*.{durable}",
            f"$JS.ACK.*.{durable}.>",
        ]
    return denied


def reader_denies() -> list[str]:
    """The reader may touch no service's durable."""
    return durable_denies()


INBOXES = "_INBOX.>"


def permissions(user: str) -> dict[str, Any] | None:
    """The server's ``permissions`` block for ``user``; None (everything) for the admin."""
    if user == ADMIN:
        return None
    if user == READER:
        return {
            "publish": {"allow": list(READER_READS), "deny": reader_denies()},
            "subscribe": {"allow": [INBOXES]},
        }
    publish = [*WRITES[user], *(f"$JS.API.STREAM.CREATE.{spec.name}" for spec in STREAMS)]
    if user in CONSUMERS:
        publish += [f"deadletter.{user}", f"$JS.ACK.{CONSUMERS[user]}.{user}.>"]
    if user in KV_BUCKETS:
        bucket = KV_BUCKETS[user]
        publish += [f"$KV.{bucket}.>", f"$JS.API.STREAM.CREATE.KV_{bucket}"]
    if user == CHECKPOINT_WRITER:
        for bucket in (*CHECKPOINT_BUCKETS.values(), CHECKPOINT_LOCK):
            publish += [f"$KV.{bucket}.>", f"$JS.API.STREAM.CREATE.KV_{bucket}"]
    return {
        "publish": {"allow": [*publish, *READS], "deny": durable_denies(user)},
        "subscribe": {"allow": [INBOXES]},
    }


def password_variable(user: str) -> str:
    """The environment variable the bundled configurations read ``user``'s password from."""
    return f"EGRESS_{user.upper()}_PASSWORD"


def authorization_conf(password: Callable[[str], str]) -> str:
    """The ``authorization`` block of a nats-server configuration. ``password(user)`` gives the
    value as it is written in the file: a quoted password, or a ``$VARIABLE``."""
    lines = ["authorization {", "  users: ["]
    for user in USERS:
        lines += ["    {", f"      user: {json.dumps(user)}", f"      password: {password(user)}"]
        perms = permissions(user)
        if perms is not None:
            lines.append("      permissions: {")
            for kind in ("publish", "subscribe"):
                lines.append(f"        {kind}: {{")
                for rule in ("allow", "deny"):
                    if rule in perms[kind]:
                        listed = [f"            {json.dumps(s)}" for s in perms[kind][rule]]
                        lines += [f"          {rule}: [", *listed, "          ]"]
                lines.append("        }")
            lines.append("      }")
        lines.append("    }")
    return "\n".join([*lines, "  ]", "}", ""])
