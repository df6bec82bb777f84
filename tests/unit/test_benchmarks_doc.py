"""docs/benchmarks.md says when each figure was measured and which are history: every section is
dated, every row of the summary gives the dates of its figures (found in its section), and a row
says *history* exactly where its section has a **History.** paragraph (a run older than a change
to what it measures). The summary once said "reconciler 3.9 ms" from a run that predated D128,
while the section measured after it said 1.2 to 1.4 ms."""

from __future__ import annotations

import re

from tests.support.docgen import ROOT

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def sections() -> dict[str, str]:
    """Each ``## `` section by its GitHub anchor (what the summary links to)."""
    found = {}
    for part in BENCHMARKS.read_text().split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        found[anchor] = body
    return found


def summary() -> list[tuple[str, str]]:
    """(anchor, "figures of" cell) per row of the summary table."""
    table = BENCHMARKS.read_text().split("\n| benchmark |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        link = re.match(r"\[.+\]\(#([^)]+)\)", cells[0])
        assert link is not None, f"a summary row without its section's link: {line}"
        rows.append((link[1], cells[-1]))
    return rows


def test_every_section_is_dated() -> None:
    undated = [anchor for anchor, body in sections().items() if not DATE.search(body)]
    assert not undated, f"sections without the date of their figures: {undated}"


def test_every_section_is_in_the_summary_with_the_dates_of_its_figures() -> None:
    found = sections()
    rows = dict(summary())
    assert sorted(rows) == sorted(found), "one summary row per section, linked"
    for anchor, when in rows.items():
        dates = DATE.findall(when)
        assert dates, f"{anchor}: the summary gives no date for its figures"
        for date in dates:
            assert date in found[anchor], f"{anchor}: {date} is not a date its section gives"


def test_history_is_marked_in_the_summary_where_its_section_says_so() -> None:
    found = sections()
    for anchor, when in summary():
        says = "**History.**" in found[anchor]
        assert says == ("*history*" in when), (
            f"{anchor}: its section {'has' if says else 'has no'} **History.** paragraph; "
            "the summary's 'figures of' must say *history* exactly then"
        )
