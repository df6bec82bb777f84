"""The one duration parser (``events.durations``) shared by the flags and the resources: what it
reads, what it refuses and how it says so, and that what it writes it reads back exactly."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.durations import EXAMPLES, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("250ms", 0.25),
        ("1m500ms", 60.5),
        ("1.5h", 5400.0),
        ("90", 90.0),
        ("45", 45.0),
        ("1.5s", 1.5),
        (" 2M ", 120.0),
        ("0", 0.0),
        ("0s", 0.0),
        (" 6H ", 21600.0),
        ("1MS", 0.001),
        (30, 30.0),
        (30.5, 30.5),
        (0, 0.0),
    ],
)
def test_durations_as_people_write_them(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "6x",
        "5x",
        "h",
        "m",
        "m5",
        "5m garbage",
        "1h 30m",
        "30m1",
        "s30",
        "-1s",
        "-1",
        "1e400",
        "9" * 400 + "h",
        "inf",
        "infinity",
        "nan",
        "1.2.3s",
        "1..5s",
        "0x10",
        -1,
        -0.5,
        math.inf,
        math.nan,
        1e400,
        pytest.param(10**400, id="10**400"),
        pytest.param(-(10**400), id="-10**400"),
        True,
        False,
    ],
)
def test_what_is_no_duration_is_a_value_error_naming_the_forms(text: Any) -> None:
    with pytest.raises(ValueError, match=r"is not a duration|an empty duration") as info:
        parse_duration(text)
    assert str(info.value).endswith(f"; use {EXAMPLES}")


def test_a_huge_value_is_not_echoed_back() -> None:
    with pytest.raises(ValueError, match="is not a duration") as info:
        parse_duration("x" * 1_000_000)
    assert len(str(info.value)) < 200
    assert "1000000 characters" in str(info.value)
    with pytest.raises(ValueError, match="a number that large"):
        parse_duration(10**5000)  # past even the digits an int may print


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (3600, "1h"),
        (21600, "6h"),
        (300, "5m"),
        (5400, "90m"),
        (30, "30s"),
        (0.5, "0.5s"),
        (0, "0s"),
        (-0.0, "0s"),
        (31_535_999, "31535999s"),
        (1e-7, "0.0000001s"),
        (7200.5, "7200.5s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(
    st.one_of(
        st.floats(min_value=0, max_value=1e12, allow_nan=False),
        st.integers(0, 10**12).map(float),
        st.integers(0, 10**6).map(lambda n: n * 60.0),
    )
)
def test_what_is_written_is_read_back_exactly(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
