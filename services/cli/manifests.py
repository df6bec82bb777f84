"""Declaring proxies and pools without a cluster: the CLI as a second source of ``declared``
events.

Only the CLI's part lives here (reading YAML, refusing what needs a cluster). The appends are
``projections.declaring`` and ``projections.pooldeclaring``, shared with the Kubernetes watcher,
so both sources decide alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml

from events import poolresource
from events.pool import PoolSpec
from events.poolresource import PoolResource, pool_uid, unknown_pool_fields
from events.resource import FieldError, ProxyResource, ResourceError, from_object, unknown_fields
from projections.declaring import uid_of
from services.providers.config import yaml_problem

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
        if unknown and validate == "strict":
            problems = "; ".join(str(e) for e in unknown)
            errors.append(FieldError(here, f"{problems} (or apply with --validate=warn)"))
            continue
        for field in unknown:
            if warn is not None:
                warn(f"{where}: {field}; ignored")
        try:
            resource = from_object(document, where)
        except ResourceError as exc:
            errors += [FieldError(f"{here}: {e.path}", _kinds(e)) for e in exc.errors]
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
    if unknown and validate == "strict":
        problems = "; ".join([*refused, *(str(e) for e in unknown)])
        errors.append(FieldError(here, f"{problems} (or apply with --validate=warn)"))
        return None
    if refused:
        errors.append(FieldError(here, "; ".join(refused)))
        return None
    for field in unknown:
        if warn is not None:
            warn(f"{where}: {field}; ignored")
    try:
        resource, spec = poolresource.from_object(document, where)
    except ResourceError as exc:
        errors.extend(FieldError(f"{here}: {e.path}", e.message) for e in exc.errors)
        return None
    return PoolDocument(resource=resource, spec=spec)


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
