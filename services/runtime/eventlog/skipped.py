"""The process's ledger of skipped events: every reader of this process notes its skips here,
and the metrics endpoint reads it (``events.skips`` is the pure bookkeeping it is made of; one
ledger per process is the runtime's business, so it lives here)."""

from __future__ import annotations

from events.skips import SkipLedger

LEDGER = SkipLedger()
