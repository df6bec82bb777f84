"""Patch and selector semantics for the test apiserver (``tests.support.kube_emulator``).

Merge patches follow RFC 7386 (a strategic merge patch is treated the same: lists are replaced
whole, which is what our code sends anyway); JSON patches follow RFC 6902, including ``test``,
which is how a client makes a patch conditional. Label selectors cover the forms controllers use:
``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import kmock


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _invalid(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=422, reason="Invalid", message=message, details={"causes": []}
    )


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _invalid(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise _invalid(f"path {path!r} does not exist") from None
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise _invalid(f"path {path!r} does not exist") from None


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise _invalid(f"path {path!r} has no container")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    try:
        if isinstance(parent, list):
            del parent[int(parts[-1])]
        else:
            del parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise _invalid(f"path {path!r} does not exist") from None
    return doc


def apply_json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise kmock.KubernetesError(
            status=400,
            reason="BadRequest",
            message="a JSON patch is a list",
            details={"causes": []},
        )
    doc = copy.deepcopy(target)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _invalid(f"the test operation on {path!r} failed")
        elif kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        else:
            raise _invalid(f"unknown JSON patch op {kind!r}")
    return doc


_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside a set's parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def match_labels(labels: dict[str, str], selector: str) -> bool:
    for term in _split(selector):
        found = _SET.match(term)
        if found:
            key, op, values = found.group(1), found.group(2), found.group(3)
            choices = {v.strip() for v in values.split(",")}
            if (labels.get(key) in choices) != (op == "in"):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True
