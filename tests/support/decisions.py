"""The decision records (docs/decisions/NNNN-title.md, one per decision) and their index,
which is generated from them: ``python -m tests.support.decisions`` rewrites
docs/decisions/README.md, and tests/unit/test_decisions.py fails while it is stale."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "decisions"
NAME = re.compile(r"^(\d{4})-[a-z0-9]+(-[a-z0-9]+)*\.md$")
HEADING = re.compile(r"^# D(\d+)\. (.+)$")
STATUS = re.compile(r"^Status: (.+?)\.?$", re.MULTILINE)

PREAMBLE = """\
# Decisions

Choices the design left open, and why they were made this way: one record per decision,
numbered in the order they were taken, each with a status (accepted, or superseded in part by a
later record, which says what changed). A number cited anywhere means one decision; numbers
D18 to D26 were never used. This index is generated from the records
(`python -m tests.support.decisions`); a test fails while it is stale.

| | decision | status |
|---|---|---|
"""


@dataclass(frozen=True, slots=True)
class Record:
    number: int
    title: str
    status: str
    path: Path


def records() -> list[Record]:
    """Every record, by number; a file that breaks the convention raises, naming it."""
    found: list[Record] = []
    for path in sorted(FOLDER.glob("*.md")):
        if path.name == "README.md":
            continue
        name = NAME.match(path.name)
        if name is None:
            raise ValueError(f"{path.name}: name a record NNNN-title-in-words.md")
        text = path.read_text()
        heading = HEADING.match(text.splitlines()[0] if text else "")
        if heading is None or int(heading[1]) != int(name[1]):
            raise ValueError(f"{path.name}: the first line must be '# D{int(name[1])}. Title'")
        status = STATUS.search(text)
        if status is None:
            raise ValueError(f"{path.name}: a 'Status: ...' line is missing")
        found.append(Record(int(name[1]), heading[2].strip(), status[1].strip(), path))
    return sorted(found, key=lambda r: r.number)


def index() -> str:
    rows = [
        f"| D{r.number} | [{r.title}]({r.path.name}) | {r.status.split(';')[0].split(' (')[0]} |"
        for r in records()
    ]
    return PREAMBLE + "\n".join(rows) + "\n"


if __name__ == "__main__":
    (FOLDER / "README.md").write_text(index())
