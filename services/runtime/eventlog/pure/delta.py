"""A delta checkpoint's payload: what changed in the ``ByProxy`` views between two checkpoints of
a chain, as compactly as the views allow (docs/decisions/0163-checkpoints-as-deltas.md).

Per view key an entry is one of: ``None`` (the view is gone), ``Entry.whole`` (a view the base
did not have, encoded whole), or a patch of the base's view: the fields whose value changed,
each encoded alone, and for a tuple field that only lost items at its front and gained items at
its back (a lease view's ``recent`` and ``outcomes`` as its fold keeps them) how many it lost
and what it gained. A lease view changed by one acquire and one release is then its counters,
its ``current`` and one ended lease, not twenty.

The views are frozen msgspec structs, so what the fold did not touch is the very same object in
the base and the views: an identity test skips it without comparing. Applying a delta checks
every entry against the views it is applied to (a patch or a removal of a view that is not
there, a field the view does not have, more items dropped than the tuple holds, a value that
does not decode as the field's type) and raises ``Unusable`` rather than fold anything wrong.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import msgspec

from services.runtime.eventlog.pure.checkpoint import Head, Packed, Unusable, compress, inflate

V = TypeVar("V")

_ENCODER = msgspec.msgpack.Encoder()


class Entry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One view's change: ``whole`` (a new view, encoded) or a patch of the base's view."""

    whole: bytes = b""
    fields: dict[str, bytes] = {}
    """Field name: its new value, encoded alone."""
    shifts: dict[str, tuple[int, bytes]] = {}
    """Tuple field name: items dropped at its front, and the items added at its back (encoded
    as a tuple of the field's type)."""


Changes = dict[str, Entry | None]
_CHANGES = msgspec.msgpack.Decoder(Changes)


def _shift(old: tuple[Any, ...], new: tuple[Any, ...]) -> int:
    """How many items ``new`` dropped from ``old``'s front if it is ``old[k:]`` followed by new
    items; -1 when it is not."""
    for drop in range(len(old) + 1):
        kept = len(old) - drop
        if kept <= len(new) and all(
            a is b or a == b for a, b in zip(old[drop:], new[:kept], strict=True)
        ):
            return drop
    return -1


class Differ(Generic[V]):
    """Deltas of one view type: made by the writer, applied by every reader."""

    def __init__(self, view_type: type[V]) -> None:
        self.view_type = view_type
        info = msgspec.structs.fields(view_type)  # type: ignore[arg-type]
        self._names = tuple(f.name for f in info)
        self._decoders = {f.name: msgspec.msgpack.Decoder(f.type) for f in info}
        self._tuples = frozenset(f.name for f in info if typing.get_origin(f.type) is tuple)
        self._view = msgspec.msgpack.Decoder(view_type)

    def diff(self, base: Mapping[str, V], views: Mapping[str, V]) -> Changes:
        """What turns ``base`` into ``views``."""
        out: Changes = {key: None for key in base if key not in views}
        for key, view in views.items():
            old = base.get(key)
            if old is view:
                continue
            if old is None:
                out[key] = Entry(whole=_ENCODER.encode(view))
                continue
            entry = self._patch(old, view)
            if entry is not None:
                out[key] = entry
        return out

    def _patch(self, old: V, new: V) -> Entry | None:
        fields: dict[str, bytes] = {}
        shifts: dict[str, tuple[int, bytes]] = {}
        for name in self._names:
            a, b = getattr(old, name), getattr(new, name)
            if a is b or a == b:
                continue
            if name in self._tuples:
                drop = _shift(a, b)
                if drop >= 0:
                    shifts[name] = (drop, _ENCODER.encode(b[len(a) - drop :]))
                    continue
            fields[name] = _ENCODER.encode(b)
        return Entry(fields=fields, shifts=shifts) if fields or shifts else None

    def apply(self, views: dict[str, V], changes: Changes) -> None:
        """Fold ``changes`` into ``views``, all or nothing: ``Unusable`` leaves ``views`` as they
        were when an entry does not fit them."""
        staged: dict[str, V | None] = {}
        try:
            for key, entry in changes.items():
                old = views.get(key)
                if entry is None:
                    if old is None:
                        raise Unusable(f"removes {key[:40]!r}, which is not there")
                    staged[key] = None
                elif entry.whole:
                    if entry.fields or entry.shifts or old is not None:
                        raise Unusable(f"adds {key[:40]!r}, which is there or is patched too")
                    staged[key] = self._view.decode(entry.whole)
                elif old is None:
                    raise Unusable(f"patches {key[:40]!r}, which is not there")
                else:
                    staged[key] = self._patched(old, entry)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Unusable(f"a change does not decode: {exc}") from None
        for key, view in staged.items():
            if view is None:
                del views[key]
            else:
                views[key] = view

    def _patched(self, old: V, entry: Entry) -> V:
        if not (entry.fields or entry.shifts) or not entry.fields.keys().isdisjoint(entry.shifts):
            raise Unusable("a patch that changes nothing, or a field twice")
        values: dict[str, Any] = {}
        for name, encoded in entry.fields.items():
            decoder = self._decoders.get(name)
            if decoder is None:
                raise Unusable(f"a field {name[:40]!r} the view does not have")
            values[name] = decoder.decode(encoded)
        for name, (drop, encoded) in entry.shifts.items():
            if name not in self._tuples:
                raise Unusable(f"a shift of {name[:40]!r}, which is not a tuple field")
            current: tuple[Any, ...] = getattr(old, name)
            if not 0 <= drop <= len(current):
                raise Unusable(f"drops {drop} of {len(current)} items")
            values[name] = current[drop:] + self._decoders[name].decode(encoded)
        return msgspec.structs.replace(old, **values)  # type: ignore[type-var]


def pack(changes: Changes) -> Packed:
    """The changes sorted by key, msgpack, zlib."""
    raw = _ENCODER.encode(dict(sorted(changes.items())))
    return compress(raw, len(changes))


def unpack(head: Head, data: bytes) -> Changes:
    """The changes of a delta's ``data``, checked against every figure of ``head``."""
    if head.full:
        raise Unusable("a full checkpoint is not a delta")
    raw = inflate(head, data)
    try:
        changes = _CHANGES.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unusable(f"the changes do not decode: {exc}") from None
    if len(changes) != head.entries:
        raise Unusable(f"{len(changes)} changes, the head says {head.entries}")
    return changes
