"""Declaring proxies and pools without a cluster: the CLI as a second source of ``declared``
events.

Only the CLI's part lives here (reading YAML, refusing what needs a cluster). The appends are
``commands.declaring`` and ``commands.pooldeclaring``, shared with the Kubernetes watcher,
so both sources decide alike.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from commands.declaring import uid_of
from events import poolresource
from events.customresource import FieldError, ResourceError
from events.pool import PoolSpec
from events.poolresource import PoolResource, pool_uid, unknown_pool_fields
from events.proxyresource import ProxyResource, from_object, unknown_fields
from services.providers.config import yaml_problem

T = TypeVar("T")

VALIDATIONS = ("strict", "warn", "ignore")
"""What ``apply --validate`` does with a field the Proxy schema does not have, as ``kubectl``'s
``--validate``: refuse the file, warn and go on, or accept silently."""


AUTOSCALE = "spec.autoscale"
"""Refused whatever ``--validate`` says: not a typo to be ignored but a feature this version
lacks, and a pool applied without it would silently hold a fixed count."""


@dataclass(frozen=True, slots=True)
class PoolDocument:
    """A ProxyPool document, validated: the spec the log keeps, its durations in seconds."""

    resource: PoolResource
    spec: PoolSpec

    @property
    def namespace(self) -> str:
        return self.resource.metadata.namespace

    @property
    def name(self) -> str:
        return self.resource.metadata.name

    @property
    def uid(self) -> str:
        return pool_uid(self.namespace, self.name)


Document = ProxyResource | PoolDocument


def is_pool(document: object) -> bool:
    return isinstance(document, dict) and document.get("kind") == poolresource.KIND


def parse_resources(
    text: str,
    source: str,
    *,
    validate: str = "strict",
    warn: Callable[[str], None] | None = None,
) -> list[ProxyResource]:
    """The Proxy documents of a file (its ProxyPool ones are checked too, then left out)."""
    documents = parse_documents(text, source, validate=validate, warn=warn)
    return [d for d in documents if isinstance(d, ProxyResource)]


def parse_documents(
    text: str,
    source: str,
    *,
    validate: str = "strict",
    warn: Callable[[str], None] | None = None,
) -> list[Document]:
    """Every Proxy and ProxyPool document of a file, in its order; any invalid one refuses the
    file, each problem named by document and field."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except (yaml.YAMLError, RecursionError) as exc:
        problem = f"not valid YAML: {yaml_problem(exc)}"
        raise ResourceError(source, [FieldError("$", problem)]) from exc
    resources: list[Document] = []
    # Each error names its document and field once: "f.yaml: document 2: spec.ttl: ...".
    errors: list[FieldError] = []
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})"
        here = f"document {index + 1}"
        if is_pool(document):
            pool = _pool(document, where, here=here, validate=validate, warn=warn, errors=errors)
            if pool is not None:
                resources.append(pool)
            continue
        unknown = [] if validate == "ignore" else unknown_fields(document)
        refused = bool(unknown) and validate == "strict"
        if refused:
            problems = "; ".join(str(e) for e in unknown)
            errors.append(FieldError(here, f"{problems} (or apply with --validate=warn)"))
        for field in unknown if not refused else []:
            if warn is not None:
                warn(f"{where}: {field}; ignored")
        resource, problems_found = every_problem(from_object, document, where)
        errors += [FieldError(f"{here}: {e.path}", _kinds(e)) for e in problems_found]
        if resource is None or refused:
            continue
        ci = resource.spec.cloud_init
        if ci is not None and ci.secret_ref is not None:
            errors.append(
                FieldError(
                    f"{here}: spec.cloudInit.secretRef",
                    "Secrets exist only in a cluster; without one, put the cloud-init in "
                    "spec.cloudInit.inline",
                )
            )
            continue
        resources.append(resource)
    if errors:
        # All or nothing: a file half-applied is harder to reason about than one refused.
        raise ResourceError(source, errors)
    return resources


def _kinds(error: FieldError) -> str:
    """A document of another kind is told both kinds a file may hold."""
    if error.path == "kind":
        return f"must be Proxy or {poolresource.KIND}"
    return error.message


def _pool(
    document: object,
    where: str,
    *,
    here: str,
    validate: str,
    warn: Callable[[str], None] | None,
    errors: list[FieldError],
) -> PoolDocument | None:
    """One ProxyPool document, or None with its problems added to ``errors``."""
    found = unknown_pool_fields(document)
    refused = [str(e) for e in found if e.path == AUTOSCALE]
    unknown = [] if validate == "ignore" else [e for e in found if e.path != AUTOSCALE]
    strict = bool(unknown) and validate == "strict"
    if strict:
        problems = "; ".join([*refused, *(str(e) for e in unknown)])
        errors.append(FieldError(here, f"{problems} (or apply with --validate=warn)"))
    elif refused:
        errors.append(FieldError(here, "; ".join(refused)))
    for field in unknown if not strict else []:
        if warn is not None:
            warn(f"{where}: {field}; ignored")
    converted, problems_found = every_problem(poolresource.from_object, document, where)
    errors.extend(FieldError(f"{here}: {e.path}", e.message) for e in problems_found)
    if converted is None or strict or refused:
        return None
    resource, spec = converted
    return PoolDocument(resource=resource, spec=spec)


MAX_PROBLEMS = 20
"""Problems of one document reported at most: enough for any hand-written file."""


def every_problem(
    convert: Callable[[Any, str], T], document: object, where: str
) -> tuple[T | None, list[FieldError]]:
    """What ``convert`` makes of ``document``, or None with every problem it has, not only the
    first: the decoder stops at the first field of a wrong type, so that field is taken out of a
    copy and the copy converted again, until it converts or a problem cannot be taken out (the
    document's root, a missing field). A problem that only the removal caused (a required field
    now missing) is not reported (docs/decisions/0147-the-cli-as-one-language.md)."""
    current = copy.deepcopy(document)
    found: list[FieldError] = []
    removed: list[str] = []
    for _ in range(MAX_PROBLEMS):
        try:
            made = convert(current, where)
        except ResourceError as exc:
            fresh = [e for e in exc.errors if not _caused_by(e, removed)]
            found += fresh
            if len(exc.errors) != 1 or not fresh or not _take_out(current, fresh[0]):
                break
            removed.append(_dotted(fresh[0].path))
            continue
        return (None, found) if found else (made, [])
    return None, found


def _dotted(path: str) -> str:
    """``$.spec.placement[0].region`` -> ``spec.placement``: the field holding the problem."""
    head = path.removeprefix("$").removeprefix(".").split("[", 1)[0]
    return head.rstrip(".")


def _take_out(document: object, error: FieldError) -> bool:
    """Remove the field ``error`` names from ``document``; False when it cannot be (the root, a
    missing field, a problem of the whole document rather than a field's)."""
    if not error.path.startswith("$.") or error.message.startswith("Object missing"):
        return False
    parts = _dotted(error.path).split(".")
    holder = document
    for part in parts[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if not isinstance(holder, dict) or parts[-1] not in holder:
        return False
    del holder[parts[-1]]
    return True


def _caused_by(error: FieldError, removed: list[str]) -> bool:
    """Whether ``error`` is about a field taken out, or says it is missing."""
    path = _dotted(error.path)
    missing = error.message.partition("`")[2].partition("`")[0]
    if error.message.startswith("Object missing") and missing:
        path = f"{path}.{missing}" if path else missing
    return any(path == r or path.startswith(f"{r}.") for r in removed)


def targets(resources: Iterable[Document]) -> list[tuple[str, str, str]]:
    """The Proxies of ``resources`` as ``delete`` names them (its pools are ``pools``)."""
    return [
        (r.metadata.namespace, r.metadata.name, uid_of(r))
        for r in resources
        if isinstance(r, ProxyResource)
    ]


def pools(resources: Iterable[Document]) -> list[PoolDocument]:
    return [r for r in resources if isinstance(r, PoolDocument)]


def _providers(resource: Document) -> list[tuple[str, str]]:
    """The providers a document's instances would be made on, each with the field naming it."""
    if isinstance(resource, ProxyResource):
        return [("spec.provider", resource.spec.provider)]
    if resource.spec.spread:
        return [
            (f"spec.spread[{index}].provider", entry.provider)
            for index, entry in enumerate(resource.spec.spread)
        ]
    return [("spec.template.provider", resource.spec.template.provider)]


def unknown_providers(
    resources: Iterable[Document], names: frozenset[str], sweep_id: str
) -> str | None:
    """Why the Proxies (and the pools) whose provider is not among ``names`` (the running
    system's, ``known_providers``) are refused, or None: their create could only fail
    (``unknown provider``), so none of the files is applied
    (docs/decisions/0098-commands-tell-the-truth-exit.md)."""
    unknown = [
        (resource, field, provider)
        for resource in resources
        for field, provider in _providers(resource)
        if provider not in names
    ]
    if not unknown:
        return None
    which = "; ".join(
        f"{_named(resource)}: {field} {provider!r}" for resource, field, provider in unknown[:5]
    )
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    return (
        f"{which}{more}: not a provider of the running system (its last GC sweep, {sweep_id}, "
        f"had: {', '.join(sorted(names))}); use one of those, or add it to the "
        "--providers-config of the executor and GC (apply --no-provider-check skips this check)"
    )


def _named(resource: Document) -> str:
    if isinstance(resource, ProxyResource):
        return f"{resource.metadata.namespace}/{resource.metadata.name}"
    return f"proxypool {resource.namespace}/{resource.name}"
