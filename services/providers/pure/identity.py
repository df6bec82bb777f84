"""The proxy's namespace and name on its cloud instance, fitted to each cloud's label grammar.

A VM in a cloud's console carried only the proxy's uid, which says nothing to the operator
looking at it. Its namespace and name are added beside the uid, as tags, labels or domain
metadata (docs/decisions/0147-the-cli-as-one-language.md). They are for people: nothing reads
them to decide (ownership stays the uid, which is never rewritten), so a character a cloud
refuses is replaced and a value too long is cut, instead of failing the create.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.providers.base import NAME_LABEL, NAMESPACE_LABEL


@dataclass(frozen=True, slots=True)
class Grammar:
    """What a cloud accepts as a label value: ``allowed`` a regex character class's inside."""

    allowed: str
    max_length: int
    lowercase: bool = False
    alphanumeric_ends: bool = False
    """The value must start and end with a letter or digit (Hetzner's, GCE's keys)."""


FILL = "-"
"""What a refused character becomes: every grammar here allows it."""


def fitted(value: str, grammar: Grammar) -> str:
    """``value`` as ``grammar`` accepts it; "" when nothing of it is left."""
    text = value.lower() if grammar.lowercase else value
    text = re.sub(f"[^{grammar.allowed}]", FILL, text)[: grammar.max_length]
    if grammar.alphanumeric_ends:
        text = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", text)
    return text


def identity_labels(namespace: str, name: str, grammar: Grammar) -> dict[str, str]:
    """``NAMESPACE_LABEL`` and ``NAME_LABEL`` fitted to ``grammar``; one left empty is left out."""
    found = {NAMESPACE_LABEL: fitted(namespace, grammar), NAME_LABEL: fitted(name, grammar)}
    return {key: value for key, value in found.items() if value}
