"""The base of every event, in a module of its own so that each module of schemas can build on it
(``events.schemas`` gathers them into one tagged union; see its docstring)."""

from __future__ import annotations

from typing import ClassVar

import msgspec


class Event(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    """Base of every event; ``category`` picks the last subject token."""

    category: ClassVar[str] = ""
