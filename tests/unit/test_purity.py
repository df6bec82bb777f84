"""Pure code has no I/O, no clock, no randomness and no process-global state.

The import contract (pyproject.toml, "Pure code ...") forbids the modules that do I/O; what an
import contract cannot see is a pure module calling the clock through a module it may import
(``datetime.now()``), drawing random ids (``uuid4``), or writing state the whole process shares
(``global``, a module's attribute). This test reads the same contract, finds every module it
covers (by package or pattern, so a new decider is covered the day it appears) and scans them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "Pure code"
# I/O that the contract must forbid besides the network libraries: files, processes, the
# environment, logging handlers, TLS, secrets and dynamic imports.
MUST_FORBID = {
    "asyncio",
    "os",
    "time",
    "random",
    "secrets",
    "pathlib",
    "shutil",
    "tempfile",
    "socket",
    "ssl",
    "http",
    "subprocess",
    "threading",
    "logging",
    "importlib",
    "structlog",
}
CLOCKS = {"now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp"}
RANDOM_IDS = {"uuid1", "uuid4"}
# Sub-modules of packages the contract must allow for their pure parts (urllib.parse).
IO_SUBMODULES = {"urllib.request", "urllib.robotparser"}


def contract() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for found in config["tool"]["importlinter"]["contracts"]:
        if found["name"].startswith(CONTRACT):
            return found  # type: ignore[no-any-return]
    raise AssertionError(f"no import contract named {CONTRACT!r}...")


def _pattern(expression: str) -> re.Pattern[str]:
    parts = [
        r"[A-Za-z_][\w.]*" if p == "**" else r"[A-Za-z_]\w*" if p == "*" else re.escape(p)
        for p in expression.split(".")
    ]
    return re.compile(r"\.".join(parts) + r"(\..+)?")


def all_modules() -> list[str]:
    names: list[str] = []
    for top in ("events", "projections", "commands", "services"):
        package = importlib.import_module(top)
        names.append(top)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, f"{top}.")]
    return names


def pure_modules() -> list[str]:
    patterns = [_pattern(e) for e in contract()["source_modules"]]
    return [name for name in all_modules() if any(p.fullmatch(name) for p in patterns)]


def source_of(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    assert spec.origin is not None, module
    return Path(spec.origin)


def impurities(tree: ast.AST) -> list[str]:
    """Clock reads, random ids and process-global writes in one module's syntax tree."""
    found: list[str] = []
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            found += [
                f"line {node.lineno}: imports {a.name}"
                for a in node.names
                if a.name in IO_SUBMODULES
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.module in IO_SUBMODULES or (
                node.module == "urllib"
                and any(f"urllib.{a.name}" in IO_SUBMODULES for a in node.names)
            ):
                found.append(f"line {node.lineno}: imports from {node.module}")
            imported |= {a.asname or a.name for a in node.names}
            if node.module == "uuid":
                found += [
                    f"line {node.lineno}: uuid.{a.name}" for a in node.names if a.name in RANDOM_IDS
                ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"line {node.lineno}: global {', '.join(node.names)}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if node.attr in CLOCKS and _names(node.value) & {"datetime", "date"}:
                found.append(f"line {node.lineno}: a clock read ({node.attr})")
            if node.attr in RANDOM_IDS and _names(node.value) == {"uuid"}:
                found.append(f"line {node.lineno}: a random id (uuid.{node.attr})")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in imported
                ):
                    found.append(f"line {node.lineno}: writes {target.value.id}.{target.attr}")
    return found


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def test_the_contract_forbids_every_kind_of_io() -> None:
    forbidden = set(contract()["forbidden_modules"])
    assert forbidden >= MUST_FORBID, sorted(MUST_FORBID - forbidden)


def test_the_contract_covers_the_domain_and_finds_modules_by_pattern() -> None:
    modules = pure_modules()
    assert {"events.codec", "projections.proxy"} <= set(modules)
    assert any(m.startswith("services.") for m in modules), "no service module is pure"


def test_pure_modules_read_no_clock_draw_no_random_id_and_write_no_global() -> None:
    problems = {
        module: found
        for module in pure_modules()
        if (found := impurities(ast.parse(source_of(module).read_text())))
    }
    assert not problems, problems


def test_the_scan_finds_what_it_looks_for() -> None:
    bad = """
import uuid
from datetime import datetime
import events.skips as skips
from uuid import uuid4
from urllib import request
import urllib.request
COUNT = 0
def f():
    global COUNT
    skips.LEDGER = None
    return datetime.now(), uuid.uuid4()
"""
    found = impurities(ast.parse(bad))
    assert len(found) == 7, found


def test_the_architecture_doc_names_the_contracts_patterns() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [e for e in contract()["source_modules"] if f"`{e}`" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}"
