"""docs/operations.md's table of NATS users is checked against the code's grants
(``services.runtime.nats.users.WRITES``): a subject granted and not documented, or documented and
not granted, fails here instead of misleading an operator."""

from __future__ import annotations

import re
from pathlib import Path

from services.runtime.nats.users import WRITES

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def rows() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (user := re.fullmatch(r"`(\w+)`", cells[0])):
            found[user.group(1)] = set(re.findall(r"`([a-z]+(?:\.[*a-z]+)+)`", cells[1]))
    return found


def test_the_security_model_lists_what_each_service_may_publish() -> None:
    documented = rows()
    for user, subjects in WRITES.items():
        assert documented.get(user) == set(subjects), user
