"""``egress-proxies get``'s egress: ``-o wide`` columns with a marker for a proxy its egress keeps
out of leasing, and the finding in ``-o json|yaml`` (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

import io
import json
from datetime import timedelta

from rich.console import Console
from rich.table import Table

from events.egress import EgressObserved
from projections.egress import EgressPolicy
from projections.meter import Bytes
from services.cli.fleet.get_cmd import (
    LeaseState,
    bytes_cell,
    egress_cell,
    item,
    place_cell,
    table,
)
from services.discovery.pure.egress_shown import index_of, shown_in
from tests.support.egress_views import T0, ready, seen, spec

NOW = T0 + timedelta(hours=1)


def render(out: Table) -> str:
    text = io.StringIO()
    Console(file=text, width=300, color_system=None).print(out)
    return text.getvalue()


def listing(policy: EgressPolicy) -> tuple[str, str, dict[str, dict[str, object]]]:
    views = [
        ready("de-ok", seen("203.0.113.5"), proxy_spec=spec("de")),
        ready("de-bad", seen("198.51.100.7", country="US", asn=7922), proxy_spec=spec("de")),
        ready("new"),
    ]
    index = index_of(views)
    egress = {v.uid: shown_in(v, policy, index) for v in views}
    listed = [(v, LeaseState()) for v in views]
    items = {v.uid: item(v, lease, egress[v.uid]) for v, lease in listed}
    return (
        render(table(listed, NOW, wide=True, egress=egress)),
        render(table(listed, NOW, egress=egress)),
        items,
    )


def test_wide_shows_the_egress_its_place_and_marks_a_mismatch() -> None:
    wide, narrow, _ = listing(EgressPolicy())
    header = wide.splitlines()[0].split()
    assert header[header.index("AGE") + 1 : header.index("UID")] == [
        "EGRESS",
        "COUNTRY/ASN",
        "BYTES",
    ]
    rows = {line.split()[1]: line for line in wide.splitlines()[1:]}
    assert "203.0.113.5" in rows["de-ok"]
    assert "DE/AS3320" in rows["de-ok"]
    assert "!" not in rows["de-ok"]
    assert "198.51.100.7 !mismatch" in rows["de-bad"]
    assert "US/AS7922" in rows["de-bad"]
    assert "EGRESS" not in narrow
    # Unchecked is marked only where discovery would hold it back for that.
    assert "!unchecked" not in rows["new"]
    strict, _, _ = listing(EgressPolicy(required=True))
    assert "- !unchecked" in next(ln for ln in strict.splitlines() if " new " in ln)


def test_json_carries_the_finding_as_the_api_shows_it() -> None:
    _, _, items = listing(EgressPolicy())
    bad = items["de-bad"]["egress"]
    assert isinstance(bad, dict)
    assert bad["ip"] == "198.51.100.7"
    assert (bad["country"], bad["asn"], bad["org"]) == ("US", 7922, "Deutsche Telekom AG")
    assert bad["notLeasableBecause"] == "egress_mismatch"
    assert "expected DE" in str(bad["seen"])
    assert bad["checkedAt"] == "2026-12-01T12:01:00.000Z"
    assert items["new"]["egress"] is None
    assert items["de-ok"]["egressReplacements"] == 0
    json.dumps(items)  # every value is JSON


def test_cells_of_a_failed_check_and_of_nothing() -> None:
    failing = ready("f", EgressObserved(provider_id="i-1", error="HTTP 404"), proxy_spec=spec("de"))
    found = shown_in(failing, EgressPolicy(), index_of([failing]))
    assert (egress_cell(found), place_cell(found)) == ("- !unchecked", "-/-")
    assert (egress_cell(None), place_cell(None)) == ("-", "-")


def test_the_bytes_cell_shows_today_and_marks_a_spent_budget() -> None:
    """D162: ``get -o wide``'s BYTES column, of today."""
    assert bytes_cell(Bytes(up=2048, down=5)) == "↑2.0 KiB ↓5 B"
    assert bytes_cell(Bytes()) == "-"
    assert bytes_cell(None) == "-"
    assert bytes_cell(Bytes(up=1), spent=True) == "↑1 B ↓0 B !budget"
    assert bytes_cell(None, spent=True) == "- !budget"
