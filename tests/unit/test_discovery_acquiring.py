"""A lease request's way to its answer (``services.discovery.pure.acquiring``), as a table: the
moves the rules make for a request, given the refusals the views give after each move. The lease
path around them (claims, catch-up, the queue) is tested against real views in
test_discovery_* and tests/integration/test_discovery*."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from services.discovery.pure.acquiring import Acquisition, Move
from services.discovery.pure.errorcodes import STATUS, ErrorCode
from services.discovery.pure.refusals import is_busy

CATCH_UP, WAIT, REFUSE = Move.CATCH_UP, Move.WAIT, Move.REFUSE
BUSY, NO_MATCH, UNKNOWN, INVALID = 503, 422, 404, 400


def moves(rules: Acquisition, refusals: list[int], *, full: bool = False) -> list[Move]:
    """The moves as ``Leases`` makes them: one per refusal, until it refuses (no claim in
    between is granted: a granted claim ends the request before any rule is asked)."""
    done: list[Move] = []
    for status in refusals:
        move = rules.after(status, done, full=full)
        done.append(move)
        if move is REFUSE:
            break
    return done


@dataclass(frozen=True)
class Row:
    name: str
    wait: float
    waiting: int
    refusals: list[int]
    moves: list[Move]
    full: bool = False
    claims_first: bool = True


ROWS = [
    Row("no-match-is-refused-at-once", 5, 0, [NO_MATCH], [REFUSE]),
    Row("unknown-sticky-proxy-at-once", 5, 0, [UNKNOWN], [REFUSE]),
    Row("invalid-at-once", 5, 0, [INVALID], [REFUSE]),
    Row("busy-catches-up-then-refuses", 0, 0, [BUSY, BUSY], [CATCH_UP, REFUSE]),
    Row("busy-after-catch-up-waits", 5, 0, [BUSY, BUSY, BUSY], [CATCH_UP, WAIT, REFUSE]),
    Row("no-match-after-catch-up", 5, 0, [BUSY, NO_MATCH], [CATCH_UP, REFUSE]),
    Row("queue-full-no-wait", 5, 0, [BUSY, BUSY], [CATCH_UP, REFUSE], full=True),
    Row("others-waiting-join-them", 5, 2, [BUSY, BUSY], [WAIT, REFUSE], claims_first=False),
    Row("others-waiting-no-match", 5, 2, [NO_MATCH], [REFUSE], claims_first=False),
    Row("others-waiting-full", 5, 2, [BUSY], [REFUSE], full=True, claims_first=False),
    Row("others-waiting-no-wait-asked", 0, 2, [BUSY, BUSY], [CATCH_UP, REFUSE]),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_a_request_makes_its_moves(row: Row) -> None:
    rules = Acquisition.of(row.wait, row.waiting)
    assert rules.claims_first is row.claims_first
    assert moves(rules, row.refusals, full=row.full) == row.moves


STATUSES = [BUSY, NO_MATCH, UNKNOWN, INVALID]


@pytest.mark.parametrize(
    ("wait", "waiting", "full"), list(itertools.product([0, 5], [0, 2], [0, 1]))
)
def test_every_request_ends_refused_within_three_moves(wait: int, waiting: int, full: int) -> None:
    """Whatever the views say after each move: each move at most once, a catch-up only for a
    request that claimed, a wait only for one that may wait while the queue has room."""
    rules = Acquisition.of(wait, waiting)
    for refusals in itertools.product(STATUSES, repeat=3):
        made = moves(rules, list(refusals), full=bool(full))
        assert made[-1] is REFUSE
        assert len(made) == len(set(made)) <= 3
        assert CATCH_UP not in made or rules.claims_first
        assert WAIT not in made or (wait > 0 and not full)
        if not is_busy(refusals[0]):
            assert made == [REFUSE]


def test_busy_is_the_503_of_no_proxy_available() -> None:
    assert [c for c in ErrorCode if is_busy(STATUS[c])] == [
        ErrorCode.NO_PROXY_AVAILABLE,
        ErrorCode.UNAVAILABLE,  # the log's 503: never a refusal of the views
    ]
    assert [Acquisition.result(s) for s in (BUSY, NO_MATCH, UNKNOWN)] == [
        "busy",
        "no_match",
        "no_match",
    ]
