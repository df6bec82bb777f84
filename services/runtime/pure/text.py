"""Untrusted text made inert for a terminal: pure, shared by the logs and the CLI.

A name, holder or message may come from the event log or the API, written by anyone with access.
Every character a terminal would act on rather than show is spelt as a visible escape, so such
text can neither send control sequences nor hide what it says
(docs/decisions/0049-untrusted-text-is-inert-on-the.md).
"""

from __future__ import annotations

_SHORT = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(code: int) -> str:
    if code in _SHORT:
        return _SHORT[code]
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
UNSAFE_CODES: tuple[int, ...] = (
    *range(0x20),  # C0, with ESC, BEL and CR
    *range(0x7F, 0xA0),  # DEL and C1 (CSI 0x9b starts an escape sequence on its own)
    *_BIDI,  # reorder what follows on the line (CVE-2021-42574)
    0x2028,  # line and paragraph separators: a new line to some viewers
    0x2029,
    *range(0xD800, 0xE000),  # lone surrogates (undecodable file names) cannot be written at all
)
_ONE_LINE = {code: _escape(code) for code in UNSAFE_CODES}
_MULTILINE = {code: text for code, text in _ONE_LINE.items() if code not in (0x09, 0x0A)}


def printable(text: str, *, multiline: bool = False) -> str:
    """``text`` with every character that a terminal would act on, rather than show, spelt as a
    visible escape (``\\x1b``, ``\\u202e``), so untrusted text can neither send control sequences
    nor hide what it says. ``multiline`` keeps newlines and tabs, for text we laid out ourselves.
    """
    return text.translate(_MULTILINE if multiline else _ONE_LINE)
