"""Every file the docs name exists: a module moved or renamed without its docs fails here, and
docs/architecture.md's "Where things happen" names modules, so it stays a map of the code.

Checked: the user-facing docs (docs/*.md, the README, the chart's NOTES.txt). The decision
records (docs/decisions/) are left out on purpose: each records what was true when it was taken,
paths included, and a later move does not rewrite history (their citations of each other are
held by tests/unit/test_decisions.py)."""

from __future__ import annotations

import re

from tests.support.docgen import ARCHITECTURE, ROOT

TOP = (
    "services",
    "events",
    "projections",
    "commands",
    "bench",
    "tests",
    "deploy",
    "clients",
    "docs",
)
EXTENSIONS = ("py", "yaml", "yml", "json", "jsonl", "md", "sh", "toml", "txt", "tpl", "conf")
PATH = re.compile(
    rf"(?<![\w/.-])((?:{'|'.join(TOP)})/[\w/.<>*-]*\.(?:{'|'.join(EXTENSIONS)}))(?![\w/-])"
)
DOCS = (
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    ROOT / "deploy" / "helm" / "egress-proxies" / "templates" / "NOTES.txt",
)
NOT_FILES = {
    # docs/architecture.md's example of a module the purity contract would cover the day it
    # appeared: it must not exist.
    "services/reconciler/pure/decide_more.py",
}


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text)) - NOT_FILES


def exists(named: str) -> bool:
    """A literal path exists; one with a placeholder (``schema-<N>.jsonl``) or a wildcard
    (``test_hetzner_*.py``) matches at least one file."""
    if "*" in named or "<" in named:
        return any(ROOT.glob(re.sub(r"<[^>]*>", "*", named)))
    return (ROOT / named).is_file()


def test_every_file_the_docs_name_exists() -> None:
    missing = [
        f"{doc.relative_to(ROOT)} names {named}, which does not exist"
        for doc in DOCS
        for named in sorted(named_paths(doc.read_text()))
        if not exists(named)
    ]
    assert not missing, "\n".join(missing)


def where_things_happen() -> str:
    return ARCHITECTURE.read_text().split("\n## Where things happen\n", 1)[1].split("\n## ", 1)[0]


def test_where_things_happen_names_the_modules_of_each_story() -> None:
    section = where_things_happen()
    named = named_paths(section)
    # The chain the section exists for: watcher -> reconciler -> executor -> provider -> Squid.
    for module in (
        "services/watcher/proxysync.py",
        "commands/declaring.py",
        "services/reconciler/service.py",
        "services/reconciler/pure/decide.py",
        "services/executor/commands.py",
        "services/providers/kubernetes/provider.py",
        "services/providers/pure/squidconf.py",
        "services/discovery/leasing/leases.py",
        "services/reconciler/pure/decide_rotate.py",
    ):
        assert module in named, module
    for story in ("`kubectl apply`", "A lease granted", "A proxy replaced"):
        assert story in section, story


def test_a_moved_module_is_caught_and_placeholders_are_globbed() -> None:
    text = "see `services/reconciler/gone.py` and tests/golden/schema-<N>.jsonl, not events/s."
    assert named_paths(text) == {"services/reconciler/gone.py", "tests/golden/schema-<N>.jsonl"}
    assert not exists("services/reconciler/gone.py")
    assert exists("tests/golden/schema-<N>.jsonl")
    assert exists("services/reconciler/pure/decide.py")
