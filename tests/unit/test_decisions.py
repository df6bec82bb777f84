"""The decision records are one file per decision with a generated index, and every citation of
one in the tree names a record that exists (tests/support/decisions.py)."""

from __future__ import annotations

import re
import subprocess

from tests.support.decisions import FOLDER, ROOT, index, records

CITED = re.compile(r"decisions/(\d{4}-[a-z0-9-]+\.md)")


def tracked_text_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    kinds = (".py", ".md", ".yaml", ".sh", ".toml", ".html")
    return [p for p in listed if p.endswith(kinds) and (ROOT / p).is_file()]


def test_every_record_follows_the_convention() -> None:
    found = records()  # raises, naming the file, on a record that does not
    numbers = [r.number for r in found]
    assert len(numbers) == len(set(numbers)), "two records share a number"
    assert found, "no decision records"


def test_the_index_is_generated_from_the_records() -> None:
    assert (FOLDER / "README.md").read_text() == index(), (
        "docs/decisions/README.md is stale: python -m tests.support.decisions"
    )


def test_every_citation_names_a_record_and_none_cites_the_old_file() -> None:
    names = {r.path.name for r in records()}
    old = "docs/" + "decisions.md"  # spelled apart so that this file does not cite it
    for path in tracked_text_files():
        text = (ROOT / path).read_text(errors="replace")
        assert old not in text, f"{path} cites {old}: cite its record in docs/decisions/"
        for cited in CITED.findall(text):
            assert cited in names, f"{path} cites decisions/{cited}, which does not exist"
