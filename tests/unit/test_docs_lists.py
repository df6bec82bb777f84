"""Where a doc lists what the code holds, the list is the code's: the streams (the backup's list,
the stream tables), the NATS users, the Deployments and CRDs a cluster runs, and the exit codes
``egress-proxies --help`` gives (every ``EXIT_*`` constant of the CLI, found, not listed).

Each of these was found wrong once by a newcomer reading the docs alone (issue 42, "What a
newcomer meets"); a list that drifts from the code fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import yaml

import services.cli
from events.subjects import POOL_CATEGORIES, PROXY_CATEGORIES
from services.cli.main import EPILOG
from services.providers.config import PROVIDER_TYPES
from services.runtime.eventlog.streams import STREAMS
from services.runtime.nats.users import USERS
from tests.support.docgen import ROOT

DOCS = ROOT / "docs"
DEPLOY = ROOT / "deploy"
NOTES = DEPLOY / "helm" / "egress-proxies" / "templates" / "NOTES.txt"
NUMBERS = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
STREAM_NAMES = [spec.name for spec in STREAMS]


def section(path: Path, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    text = path.read_text()
    level = heading.split(" ", 1)[0]
    if f"\n{heading}\n" not in text:
        raise AssertionError(f"{path.name} has no heading '{heading}' any more: update this test")
    body = text.split(f"\n{heading}\n", 1)[1]
    ends = [body.find(f"\n{'#' * n} ") for n in range(1, len(level) + 1)]
    return body[: min([e for e in ends if e >= 0], default=len(body))]


def table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    ]


def stream_table(path: Path, heading: str) -> dict[str, str]:
    rows = table_rows(section(path, heading))
    return {row[0].strip("`"): row[1] for row in rows if row[0].strip("`") in STREAM_NAMES}


def categories(cell: str) -> list[str]:
    return re.findall(r"`(\w+)`", cell.split("(", 1)[1]) if "(" in cell else []


def test_the_stream_tables_list_every_stream_and_every_category() -> None:
    for path, heading in (
        (DOCS / "architecture.md", "### Streams"),
        (DOCS / "nats-cli.md", "## The streams"),
    ):
        table = stream_table(path, heading)
        assert sorted(table) == sorted(STREAM_NAMES), f"{path.name}, {heading}: {sorted(table)}"
        assert categories(table["PROXY"]) == list(PROXY_CATEGORIES), path.name
        assert categories(table["POOL"]) == list(POOL_CATEGORIES), path.name


def test_the_backup_holds_the_streams_the_docs_say() -> None:
    held = section(DOCS / "operations.md", "### What a backup holds").split("**as it was", 1)[0]
    assert re.findall(r"`([A-Z]+)`", held) == STREAM_NAMES
    copied = re.search(r"^for s in ([A-Z ]+); do$", (DOCS / "nats-cli.md").read_text(), re.M)
    assert copied is not None, "docs/nats-cli.md no longer copies the streams in a loop"
    assert copied[1].split() == STREAM_NAMES
    users = section(DOCS / "operations.md", "## NATS users")
    assert f"create the {NUMBERS[len(STREAMS)]} streams" in users


def test_the_nats_users_are_the_secrets_keys_in_the_docs_and_the_notes() -> None:
    loop = re.search(r"for u in ([a-z ]+); do", (DOCS / "kubernetes.md").read_text())
    assert loop is not None
    assert loop[1].split() == list(USERS)
    notes = NOTES.read_text().split("one key per NATS user:", 1)[1].split("\n", 1)[0]
    assert re.findall(r"[a-z]+", notes) == list(USERS)


def deployments() -> list[str]:
    found = []
    for path in sorted((DEPLOY / "services").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                found.append(doc["metadata"]["name"])
    return found


def test_the_docs_count_and_list_the_deployments_and_the_crds() -> None:
    names = deployments()
    text = (DOCS / "kubernetes.md").read_text()
    assert f"the {NUMBERS[len(names)]} Deployments" in text
    listed = [
        row[0].strip("`") for row in table_rows(section(DOCS / "kubernetes.md", "### What runs"))
    ]
    assert sorted(n for n in listed if n.startswith("egress-")) == sorted(names)
    notes = NOTES.read_text()
    assert NUMBERS[len(names)] in notes
    for name in names:
        assert name.removeprefix("egress-") in notes, name
    for crd in sorted((DEPLOY / "crd").glob("*.yaml")):
        path = str(crd.relative_to(ROOT))
        assert path in notes, f"NOTES.txt does not say how to upgrade {path}"
        assert path in section(DOCS / "kubernetes.md", "### Helm"), path


def test_the_nats_chart_repository_is_named() -> None:
    text = (DOCS / "kubernetes.md").read_text()
    added = re.search(r"^helm repo add nats (\S+)$", text, re.M)
    assert added is not None, "step 2 no longer adds the NATS chart's repository"
    assert added[1].startswith("https://"), f"name the NATS chart's repository, not {added[1]}"


def cli_exit_codes() -> dict[str, int]:
    """Every ``EXIT_*`` integer constant in the CLI's modules, wherever they move to."""
    found: dict[str, int] = {}
    for info in pkgutil.walk_packages(services.cli.__path__, "services.cli."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("EXIT_") and isinstance(value, int) and not isinstance(value, bool):
                found[f"{info.name}.{name}"] = value
    return found


def test_help_lists_every_exit_code_the_cli_defines_and_no_other() -> None:
    listed = [int(m[1]) for m in re.finditer(r"^ {1,2}(\d+) {2}", EPILOG, re.M)]
    assert listed == sorted(set(listed)), "--help lists each code once, in order"
    defined = cli_exit_codes()
    assert set(defined.values()) | {0, 1} == set(listed), (
        f"--help lists {listed}; the CLI defines {sorted(defined.items(), key=lambda i: i[1])}"
    )


def test_the_architecture_names_every_provider_type() -> None:
    text = re.sub(r"\s*\n\s*│?\s*", " ", (DOCS / "architecture.md").read_text())
    lists = [
        re.search(r"the provider contract; ([a-z]+(?:, [a-z]+)*)", text),
        re.search(r"──▶ provider \(([a-z, ]+)\)", text),
        re.search(r"Every provider \(([a-z, ]+), and the fake\)", text),
    ]
    everything = set(PROVIDER_TYPES)
    for found in lists:
        assert found is not None, "docs/architecture.md no longer lists the providers there"
        named = {name.strip() for name in found[1].split(",")}
        assert named | {"fake"} == everything, f"docs/architecture.md lists {sorted(named)}"
