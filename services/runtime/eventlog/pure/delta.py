"""A delta checkpoint's payload: what changed in the ``ByProxy`` views between two checkpoints of
a chain, as compactly as the views allow (docs/decisions/0163-checkpoints-as-deltas.md).

Per view key an entry is one of: ``None`` (the view is gone), ``whole`` (a view the base did
not have), or a patch of the base's view: the fields whose value changed, and for a tuple field
that only lost items at its front and gained items at its back (a lease view's ``recent`` and
``outcomes`` as its fold keeps them) how many it lost and what it gained. A lease view changed
by one acquire and one release is then its counters, its ``current`` and one ended lease, not
twenty. A whole delta decodes in one call, typed: the patches are structs made for the view
type (every field optional), so applying one costs a ``structs.replace``.

The views are frozen msgspec structs, so what the fold did not touch is the very same object in
the base and the views: an identity test skips it without comparing. Decoding and applying a
delta check every entry against the view type and the views it is applied to (a patch or a
removal of a view that is not there, a field the view does not have, more items dropped than
the tuple holds, a value that does not decode as the field's type) and raise ``Unusable``
rather than fold anything wrong.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import msgspec

from services.runtime.eventlog.pure.checkpoint import Head, Packed, Unusable, compress, inflate

V = TypeVar("V")

_ENCODER = msgspec.msgpack.Encoder()
UNSET = msgspec.UNSET


Changes = dict[str, Any]
"""View key: an ``Entry``, or None for a view that is gone."""


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
    """Deltas of one view type: made by the writer, applied by every reader. A patch's fields
    and shifts are structs made for the view type, every field optional, so a whole delta
    decodes in one call and typed as the view's fields are."""

    def __init__(self, view_type: type[V]) -> None:
        self.view_type = view_type
        info = msgspec.structs.fields(view_type)  # type: ignore[arg-type]
        self._names = tuple(f.name for f in info)
        self._tuples = frozenset(f.name for f in info if typing.get_origin(f.type) is tuple)
        options: dict[str, Any] = {"frozen": True, "forbid_unknown_fields": True}
        self.fields_type: Any = msgspec.defstruct(
            "Fields", [(f.name, f.type | msgspec.UnsetType, UNSET) for f in info], **options
        )
        self.shifts_type: Any = msgspec.defstruct(
            "Shifts",
            [
                (f.name, tuple[int, f.type] | msgspec.UnsetType, UNSET)  # type: ignore[name-defined]
                for f in info
                if f.name in self._tuples
            ],
            **options,
        )
        self._entry: Any = msgspec.defstruct(
            "Entry",
            [
                ("whole", view_type | None, None),
                ("fields", self.fields_type | None, None),
                ("shifts", self.shifts_type | None, None),
            ],
            array_like=True,
            frozen=True,
            forbid_unknown_fields=True,
        )
        self._changes = msgspec.msgpack.Decoder(dict[str, self._entry | None])  # type: ignore[name-defined]

    def diff(self, base: Mapping[str, V], views: Mapping[str, V]) -> Changes:
        """What turns ``base`` into ``views``."""
        out: Changes = {key: None for key in base if key not in views}
        for key, view in views.items():
            old = base.get(key)
            if old is view:
                continue
            if old is None:
                out[key] = self._entry(whole=view)
                continue
            entry = self._patch(old, view)
            if entry is not None:
                out[key] = entry
        return out

    def _patch(self, old: V, new: V) -> Any:
        fields: dict[str, Any] = {}
        shifts: dict[str, tuple[int, tuple[Any, ...]]] = {}
        for name in self._names:
            a, b = getattr(old, name), getattr(new, name)
            if a is b or a == b:
                continue
            if name in self._tuples:
                drop = _shift(a, b)
                if drop >= 0:
                    shifts[name] = (drop, b[len(a) - drop :])
                    continue
            fields[name] = b
        if not fields and not shifts:
            return None
        return self._entry(
            fields=self.fields_type(**fields) if fields else None,
            shifts=self.shifts_type(**shifts) if shifts else None,
        )

    def decode(self, raw: bytes) -> Changes:
        try:
            changes: Changes = self._changes.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Unusable(f"the changes do not decode: {exc}") from None
        return changes

    def apply(self, views: dict[str, V], changes: Changes, *, expect: int = -1) -> None:
        """Fold ``changes`` (as ``decode`` gives them) into ``views``, all or nothing:
        ``Unusable`` leaves ``views`` as they were when an entry does not fit them, or when
        the views would not number ``expect`` (-1: any number) after it."""
        staged: dict[str, V | None] = {}
        count = len(views)
        for key, entry in changes.items():
            old = views.get(key)
            if entry is None:
                if old is None:
                    raise Unusable(f"removes {key[:40]!r}, which is not there")
                staged[key] = None
                count -= 1
            elif entry.whole is not None:
                if entry.fields is not None or entry.shifts is not None or old is not None:
                    raise Unusable(f"adds {key[:40]!r}, which is there or is patched too")
                staged[key] = entry.whole
                count += 1
            elif old is None:
                raise Unusable(f"patches {key[:40]!r}, which is not there")
            else:
                staged[key] = self._patched(old, entry)
        if expect >= 0 and count != expect:
            raise Unusable(f"{count} views after the delta, the head says {expect}")
        for key, view in staged.items():
            if view is None:
                del views[key]
            else:
                views[key] = view

    def _patched(self, old: V, entry: Any) -> V:
        values: dict[str, Any] = {}
        if entry.fields is not None:
            values = {
                k: v for k, v in msgspec.structs.asdict(entry.fields).items() if v is not UNSET
            }
        if entry.shifts is not None:
            for name, shift in msgspec.structs.asdict(entry.shifts).items():
                if shift is UNSET:
                    continue
                if name in values:
                    raise Unusable(f"{name[:40]!r} both set and shifted")
                drop, added = shift
                current: tuple[Any, ...] = getattr(old, name)
                if not 0 <= drop <= len(current):
                    raise Unusable(f"drops {drop} of {len(current)} items")
                values[name] = current[drop:] + added
        if not values:
            raise Unusable("a patch that changes nothing")
        return msgspec.structs.replace(old, **values)  # type: ignore[type-var]

    def pack(self, changes: Changes) -> Packed:
        """The changes sorted by key, msgpack, zlib. Not in ``compact_type``: a delta holds few
        defaults beyond what zlib already takes out, and converting its values tripled the
        writer's packing for 2% fewer bytes
        (docs/decisions/0167-checkpoints-compact-and-chained.md)."""
        raw = _ENCODER.encode(dict(sorted(changes.items())))
        return compress(raw, len(changes))

    def unpack(self, head: Head, data: bytes) -> Changes:
        """The changes of a delta's ``data``, checked against every figure of ``head``."""
        if head.full:
            raise Unusable("a full checkpoint is not a delta")
        changes = self.decode(inflate(head, data))
        if len(changes) != head.entries:
            raise Unusable(f"{len(changes)} changes, the head says {head.entries}")
        return changes
