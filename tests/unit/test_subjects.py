from __future__ import annotations

import pytest

from events import subjects
from events.schemas import HealthChanged, LeaseExpired
from events.subjects import subject_matches


def test_proxy_subjects_per_category() -> None:
    agg = subjects.proxy("abc-123")
    assert agg.filter_subject == "proxy.abc-123.>"
    assert agg.subject_for(HealthChanged(healthy=True)) == "proxy.abc-123.health"


def test_lease_is_one_subject() -> None:
    agg = subjects.lease("abc")
    assert agg.subject_for(LeaseExpired(lease_id="l", proxy_uid="abc")) == "lease.abc"


@pytest.mark.parametrize("bad", ["", "a.b", "a*", ">", "with space", "x" * 129])
def test_values_that_cannot_be_tokens_are_refused_with_the_fix(bad: str) -> None:
    with pytest.raises(subjects.InvalidToken, match="letters, digits"):
        subjects.proxy(bad)


@pytest.mark.parametrize(
    ("pattern", "subject", "match"),
    [
        ("proxy.a.>", "proxy.a.cmd", True),
        ("proxy.a.>", "proxy.a", False),
        ("proxy.*.cmd", "proxy.b.cmd", True),
        ("proxy.*.cmd", "proxy.b.health", False),
        ("lease.a", "lease.a", True),
        ("lease.a", "lease.ab", False),
    ],
)
def test_subject_matching(pattern: str, subject: str, match: bool) -> None:
    assert subject_matches(pattern, subject) is match


@pytest.mark.parametrize("value", ["abc\n", "abc\r\n", "\nabc", "a\nb"])
def test_a_line_break_is_no_part_of_a_subject_token(value: str) -> None:
    """``$`` also matches before a final line break; a token must end where its text ends, or a
    newline would reach a NATS subject."""
    with pytest.raises(subjects.InvalidToken):
        subjects.check_token("proxy uid", value)
