"""Time-travel checkpoints as bytes: their labels, keys, packing and every check a reader makes
before it trusts one (docs/decisions/0163-checkpoints-as-deltas.md, after
docs/decisions/0131-time-travel-folds-from-checkpoints-the.md), written by the I/O in
``services.runtime.eventlog.checkpoints``.

A checkpoint is derived state, never a fact: the ``ByProxy`` views of one stream folded from
``origin`` to sequence ``seq``, with the tolerant fold time travel uses. A *full* one holds every
view; a *delta* holds only what changed since its base, the previous checkpoint of its chain
(``pure.delta``), and its head names that base by sequence and digest, so a reader checks the
chain link by link from the full it starts at. The digest of the payload is in the chunk keys,
so a payload never mixes with another's chunks, and the head, written last, names one complete
set.

Anything a reader cannot verify (a head or chunk that does not decode, a label that does not fit
the stream, a digest or size that does not match) raises ``Unusable``: the reader then tries an
older checkpoint or replays from the first event, which is always right, only slower. Sizes are
bounded before anything is allocated, so a hostile value costs at most ``MAX_PACKED`` bytes read
and ``MAX_RAW`` bytes decompressed.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import msgspec

V = TypeVar("V")

FORMAT = 2
"""The layout of heads and payloads; a change takes a new number (and new keys). 2: deltas."""
CHUNK = 256 * 1024
"""Bytes per KV value: under any server's max_payload (1 MB by default)."""
MAX_PACKED = 128 * 1024 * 1024
"""The largest compressed checkpoint a reader fetches: 512 chunks."""
MAX_CHUNKS = MAX_PACKED // CHUNK
MAX_RAW = 1024 * 1024 * 1024
"""The largest checkpoint a reader decompresses (about 100 times what 10,000 proxies take)."""
MAX_HEAD = 4096
"""A head value longer than this is not a head."""
MAX_CHAIN = 1000
"""Deltas a chain may hold after its full one; a head claiming more is not one (the writer
starts a full one long before: ``full_due``)."""
FULL_RATIO = 0.3
"""A writer starts a new chain with a full checkpoint once the deltas since the last full add up
to this share of its bytes: the full ones then cost at most twice this share of the deltas
whatever the fleet's size, and a reader applies at most that many bytes of deltas after
decoding a full one (docs/decisions/0163-checkpoints-as-deltas.md)."""
LEVEL = 3
"""zlib's: a third faster to pack than 6 and as fast to inflate, for 7% more bytes."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Unusable(ValueError):
    """A checkpoint a reader must not fold from; the message says why."""


class Head(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The label of one checkpoint: what it covers and how to read its chunks."""

    format: int
    stream: str
    tag: str
    seq: int
    """The last stream sequence folded into the views."""
    subject: str
    """The subject of event ``seq``: with ``time_us``, how a reader recognises the stream."""
    time_us: int
    """The server timestamp of event ``seq`` (microseconds since the epoch)."""
    high_us: int
    """The latest timestamp of any event folded: an instant before it is not covered."""
    origin: int
    """The first sequence folded (the stream's first when the chain began)."""
    views: int
    """The views once the payload is folded in (a delta's base views, changed)."""
    raw: int
    packed: int
    chunks: int
    digest: str
    full: bool = True
    """Every view (True), or only those changed since ``base_seq`` (a delta)."""
    entries: int = 0
    """Entries in the payload: views for a full one, changes and removals for a delta."""
    base_seq: int = 0
    """A delta's base: the previous checkpoint of its chain (0 for a full one)."""
    base_digest: str = ""
    """The digest of the base's payload: the link a reader checks."""
    depth: int = 0
    """Deltas since the chain's full one, this one included (0 for a full one)."""
    chain_bytes: int = 0
    """Packed bytes of those deltas, this one's included."""
    full_packed: int = 0
    """Packed bytes of the chain's full one (its own for a full one)."""


_HEAD = msgspec.msgpack.Decoder(Head)
_ENCODER = msgspec.msgpack.Encoder()


def micros(moment: datetime) -> int:
    """Microseconds since the epoch, exactly (a float would round)."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def schema_hash(view_type: type[Any]) -> str:
    """Of the view's schema: a view that changes shape gets new keys even if its fold version
    was not bumped (``projections.versions``)."""
    schema = json.dumps(msgspec.json.schema(view_type), sort_keys=True)
    return hashlib.sha256(schema.encode()).hexdigest()[:12]


def tag_of(version: int, view_type: type[Any]) -> str:
    return f"f{FORMAT}v{version}-{schema_hash(view_type)}"


def head_key(tag: str, seq: int) -> str:
    return f"h.{tag}.{seq:012d}"


def heads_filter(tag: str) -> str:
    return f"h.{tag}.*"


def chunk_key(tag: str, seq: int, digest: str, index: int) -> str:
    return f"c.{tag}.{seq:012d}.{digest[:16]}.{index}"


def seq_of_key(key: str) -> int:
    """The sequence a head key names; -1 when it names none."""
    last = key.rsplit(".", 1)[-1]
    return int(last) if last.isdigit() and len(last) == 12 else -1


def is_boundary(seq: int, every: int) -> bool:
    return seq > 0 and seq % every == 0


def encode_head(head: Head) -> bytes:
    return _ENCODER.encode(head)


def decode_head(value: bytes) -> Head:
    if len(value) > MAX_HEAD:
        raise Unusable(f"a head of {len(value)} bytes (at most {MAX_HEAD})")
    try:
        head = _HEAD.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unusable(f"the head does not decode: {exc}") from None
    if head.format != FORMAT:
        raise Unusable(f"format {head.format}, this build reads {FORMAT}")
    if not (0 <= head.packed <= MAX_PACKED and 0 <= head.raw <= MAX_RAW):
        raise Unusable(f"sizes out of bounds: packed {head.packed}, raw {head.raw}")
    if head.chunks != -(-head.packed // CHUNK) or head.views < 0 or len(head.digest) != 64:
        raise Unusable("chunk count, view count or digest malformed")
    if not 0 < head.origin <= head.seq:
        raise Unusable(f"origin {head.origin} is not within 1..{head.seq}")
    if head.entries < 0 or (head.full and head.entries != head.views):
        raise Unusable(f"{head.entries} entries for {head.views} views")
    if head.full:
        if head.base_seq or head.base_digest or head.depth or head.chain_bytes:
            raise Unusable("a full checkpoint that names a base")
    elif not (0 < head.base_seq < head.seq and len(head.base_digest) == 64):
        raise Unusable(f"a delta whose base ({head.base_seq}) is not before it ({head.seq})")
    elif not (0 < head.depth <= MAX_CHAIN and 0 <= head.chain_bytes <= MAX_CHAIN * MAX_PACKED):
        raise Unusable(f"a delta {head.depth} deep in its chain (at most {MAX_CHAIN})")
    if not 0 <= head.full_packed <= MAX_PACKED:
        raise Unusable(f"a full checkpoint of {head.full_packed} bytes")
    return head


def full_due(base: Head | None, delta_packed: int) -> bool:
    """Whether the next checkpoint after ``base`` (None: none yet) must be a full one rather
    than a delta of ``delta_packed`` bytes."""
    if base is None:
        return True
    chain = (0 if base.full else base.chain_bytes) + delta_packed
    return base.depth + 1 > MAX_CHAIN or chain > FULL_RATIO * max(base.full_packed, 1)


def fits(head: Head, *, stream: str, tag: str, key_seq: int, last: int) -> str:
    """Why ``head`` is garbage on a stream whose last sequence is ``last``; "" if it is not.
    One before ``first`` is not garbage, only aged out with its events (``usable`` skips it)."""
    if head.stream != stream or head.tag != tag:
        return f"labelled {head.stream}/{head.tag}, wanted {stream}/{tag}"
    if head.seq != key_seq:
        return f"labelled sequence {head.seq} under the key of {key_seq}"
    if head.seq > last:
        return f"sequence {head.seq} is beyond the stream's last ({last}): recreated?"
    return ""


def usable(heads: list[Head], *, at_us: int | None, first: int, last: int) -> list[Head]:
    """The heads an instant may fold from, newest first: covering nothing after ``at_us`` (None:
    any instant) and with every later event still stored."""
    fit = [h for h in heads if first <= h.seq <= last and (at_us is None or h.high_us <= at_us)]
    return sorted(fit, key=lambda h: h.seq, reverse=True)


def chain(target: Head, by_seq: dict[int, Head]) -> list[Head]:
    """The checkpoints a reader folds to reach ``target``: its chain's full one first, then every
    delta up to ``target``, each the base the next names by sequence and digest. Empty when a
    link is missing or names other bytes than the head under its sequence holds."""
    out = [target]
    head = target
    while not head.full:
        base = by_seq.get(head.base_seq)
        if base is None or base.digest != head.base_digest or base.depth != head.depth - 1:
            return []
        out.append(base)
        head = base
    out.reverse()
    return out


class Packed(msgspec.Struct, frozen=True):
    raw: int
    views: int
    data: bytes
    digest: str

    def chunks(self) -> list[bytes]:
        return [self.data[i : i + CHUNK] for i in range(0, len(self.data), CHUNK)] or [b""]


def compact_type(view_type: Any, made: dict[Any, Any] | None = None) -> Any:
    """The type the writer encodes ``view_type`` as: the same fields under the same names in
    maps, every struct in it with ``omit_defaults``, so a value equal to its field's default
    (the empty strings, zeros, Nones and empty tuples that make up most of an ended lease) is
    not written. Readers decode the bytes as ``view_type`` itself, which fills those defaults
    in: no conversion back, and the payloads written before (every field present) read the
    same way (docs/decisions/0167-checkpoints-compact-and-chained.md). A struct whose encoding
    is not a plain map of its field names (tagged, array-like, renamed) is kept."""
    made = {} if made is None else made
    if isinstance(view_type, type) and issubclass(view_type, msgspec.Struct):
        if view_type in made:
            return made[view_type]
        config = view_type.__struct_config__
        if (
            config.tag is not None
            or config.array_like
            or view_type.__struct_encode_fields__ != view_type.__struct_fields__
        ):
            return view_type
        fields: list[Any] = []
        for f in msgspec.structs.fields(view_type):
            kind = compact_type(f.type, made)
            if f.default is not msgspec.NODEFAULT:
                fields.append((f.name, kind, f.default))
            elif f.default_factory is not msgspec.NODEFAULT:
                fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
            else:
                fields.append((f.name, kind))
        made[view_type] = msgspec.defstruct(
            f"Compact{view_type.__name__}", fields, kw_only=True, omit_defaults=True
        )
        return made[view_type]
    origin, args = typing.get_origin(view_type), typing.get_args(view_type)
    if origin is None or not args:
        return view_type
    inner = tuple(a if a is Ellipsis else compact_type(a, made) for a in args)
    if origin in (typing.Union, types.UnionType):
        return typing.Union[inner]  # noqa: UP007 (a union made of a tuple of types)
    return origin[inner]


class Packer(Generic[V]):
    """Full checkpoints of one view type, in its ``compact_type``."""

    def __init__(self, view_type: type[V]) -> None:
        self._compact = dict[str, compact_type(view_type)]  # type: ignore[misc]

    def encode(self, views: dict[str, V]) -> bytes:
        """The views sorted by key, msgpack: the same views give the same bytes."""
        ordered = dict(sorted(views.items()))
        return _ENCODER.encode(msgspec.convert(ordered, self._compact, from_attributes=True))

    def pack(self, views: dict[str, V]) -> Packed:
        """``encode``, then zlib."""
        return compress(self.encode(views), len(views))


def compress(raw: bytes, entries: int) -> Packed:
    data = zlib.compress(raw, LEVEL)
    return Packed(len(raw), entries, data, hashlib.sha256(data).hexdigest())


def inflate(head: Head, data: bytes) -> bytes:
    """The raw payload of ``data``, checked against the head's sizes and digest."""
    if len(data) != head.packed:
        raise Unusable(f"{len(data)} bytes stored, the head says {head.packed}")
    if hashlib.sha256(data).hexdigest() != head.digest:
        raise Unusable("the stored bytes do not match the head's digest")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, head.raw + 1)
    except zlib.error as exc:
        raise Unusable(f"the payload does not decompress: {exc}") from None
    if len(raw) != head.raw or not inflater.eof or inflater.unconsumed_tail:
        raise Unusable(f"the payload is not {head.raw} bytes")
    return raw


class Unpacker(Generic[V]):
    def __init__(self, view_type: type[V]) -> None:
        self._decoder = msgspec.msgpack.Decoder(dict[str, view_type])  # type: ignore[valid-type]

    def unpack(self, head: Head, data: bytes) -> dict[str, V]:
        """The views of a full checkpoint's ``data``, checked against every figure of ``head``."""
        if not head.full:
            raise Unusable("a delta is not a full checkpoint")
        raw = inflate(head, data)
        try:
            views: dict[str, V] = self._decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Unusable(f"the views do not decode: {exc}") from None
        if len(views) != head.views:
            raise Unusable(f"{len(views)} views, the head says {head.views}")
        return views
