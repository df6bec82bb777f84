"""A proxy service's answers onto the error taxonomy (D160), row by row, and the delay a
throttled answer asks for, bounded whatever the header says."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.providers.base import (
    MAX_RETRY_AFTER,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.upstream.pure.refusals import Answer, refusal, retry_after_seconds

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
IN_90_SECONDS = format_datetime(NOW + timedelta(seconds=90), usegmt=True)


@dataclass(frozen=True)
class Story:
    """One answer of the service, and what the operator must see."""

    what: str
    answer: Answer
    expected: type[ProviderError] | None
    says: str = ""
    wait: float = 0.0


STORIES = [
    Story("let through", Answer(200), None),
    Story("a redirect is the site's", Answer(302), None),
    Story(
        "the account refused",
        Answer(407, body="Proxy Authentication Required"),
        Permanent,
        "provider resi-de: the proxy service refused the account (HTTP 407)",
    ),
    Story("payment required", Answer(402), QuotaExceeded, "traffic or balance is spent (HTTP 402)"),
    Story(
        "a quota body on a 403",
        Answer(403, body="Traffic limit reached for this user"),
        QuotaExceeded,
        "HTTP 403",
    ),
    Story(
        "out of balance on a 400",
        Answer(400, body='{"error": "insufficient balance"}'),
        QuotaExceeded,
    ),
    Story(
        "a 429 with seconds",
        Answer(429, retry_after="30"),
        Transient,
        "throttling (HTTP 429); it asked for 30 s",
        30.0,
    ),
    Story("a 429 with a date", Answer(429, retry_after=IN_90_SECONDS), Transient, "", 90.0),
    Story(
        "a 429 asking for a week", Answer(429, retry_after="604800"), Transient, "", MAX_RETRY_AFTER
    ),
    Story("a 429 asking for ever", Answer(429, retry_after="inf"), Transient, "", 0.0),
    Story("a 429 asking for nan", Answer(429, retry_after="nan"), Transient, "", 0.0),
    Story("a 429 asking for the past", Answer(429, retry_after="-5"), Transient, "", 0.0),
    Story("a 429 with garbage", Answer(429, retry_after="soon"), Transient, "", 0.0),
    Story("a 429 without a header", Answer(429), Transient, "throttling (HTTP 429)", 0.0),
    Story("a 502 of the gateway", Answer(502), Transient, "failed (HTTP 502)"),
    Story("a 503 with a delay", Answer(503, retry_after="12"), Transient, "", 12.0),
    Story("no answer", Answer(0), Transient, "did not answer"),
    Story("a timeout status", Answer(408), Transient),
    Story(
        "a country the plan lacks",
        Answer(403, body="country not allowed"),
        Permanent,
        "refused the request (HTTP 403)",
    ),
    Story("a status nobody sends", Answer(999), Transient, "a status no proxy sends"),
    Story("an informational status", Answer(101), Transient),
]


@pytest.mark.parametrize("story", STORIES, ids=[s.what for s in STORIES])
def test_each_answer_maps_to_one_class(story: Story) -> None:
    found = refusal(story.answer, entry="resi-de", now=NOW)
    if story.expected is None:
        assert found is None
        return
    assert type(found) is story.expected
    assert found is not None
    assert story.says in str(found)
    assert found.retry_after == story.wait


def test_a_quota_word_on_a_5xx_is_still_the_service_failing() -> None:
    """A 5xx recovers by itself; only a refusal (4xx) is read for a quota."""
    found = refusal(Answer(503, body="quota service unavailable"), entry="e", now=NOW)
    assert type(found) is Transient


@given(status=st.integers(-10, 1000), header=st.text(max_size=80), body=st.text(max_size=300))
def test_any_answer_is_none_or_one_class_with_a_bounded_wait(
    status: int, header: str, body: str
) -> None:
    found = refusal(Answer(status, header, body), entry="e", now=NOW)
    if 200 <= status < 400:
        assert found is None
        return
    assert isinstance(found, Permanent | QuotaExceeded | Transient)
    assert 0.0 <= found.retry_after <= MAX_RETRY_AFTER


@given(header=st.text(max_size=100))
def test_retry_after_is_finite_and_bounded(header: str) -> None:
    seconds = retry_after_seconds(header, NOW)
    assert 0.0 <= seconds <= MAX_RETRY_AFTER


def test_a_date_without_a_zone_or_a_naive_now_reads_as_none() -> None:
    assert retry_after_seconds("Mon, 07 Dec 2026 12:01:30 -0000", NOW) == 0.0
    assert retry_after_seconds(IN_90_SECONDS, NOW.replace(tzinfo=None)) == 0.0
