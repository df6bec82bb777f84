"""Declaring proxies without a cluster: the CLI as a second source of ``declared`` events.

Only the CLI's part lives here (reading YAML, refusing what needs a cluster). The appends are
``projections.declaring``, shared with the Kubernetes watcher, so both sources decide alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import yaml

from events.resource import FieldError, ProxyResource, ResourceError, from_object, unknown_fields
from projections.declaring import uid_of
from services.providers.config import yaml_problem

VALIDATIONS = ("strict", "warn", "ignore")
"""What ``apply --validate`` does with a field the Proxy schema does not have, as ``kubectl``'s
``--validate``: refuse the file, warn and go on, or accept silently."""


def parse_resources(
    text: str,
    source: str,
    *,
    validate: str = "strict",
    warn: Callable[[str], None] | None = None,
) -> list[ProxyResource]:
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except (yaml.YAMLError, RecursionError) as exc:
        problem = f"not valid YAML: {yaml_problem(exc)}"
        raise ResourceError(source, [FieldError("$", problem)]) from exc
    resources: list[ProxyResource] = []
    # Each error names its document and field once: "f.yaml: document 2: spec.ttl: ...".
    errors: list[FieldError] = []
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})"
        here = f"document {index + 1}"
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
            errors += [FieldError(f"{here}: {e.path}", e.message) for e in exc.errors]
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


def targets(resources: Iterable[ProxyResource]) -> list[tuple[str, str, str]]:
    return [(r.metadata.namespace, r.metadata.name, uid_of(r)) for r in resources]


def unknown_providers(
    resources: Iterable[ProxyResource], names: frozenset[str], sweep_id: str
) -> str | None:
    """Why the Proxies whose ``spec.provider`` is not among ``names`` (the running system's,
    ``known_providers``) are refused, or None: their create could only fail (``unknown
    provider``), so none of the files is applied
    (docs/decisions/0098-commands-tell-the-truth-exit.md)."""
    unknown = [r for r in resources if r.spec.provider not in names]
    if not unknown:
        return None
    which = "; ".join(
        f"{r.metadata.namespace}/{r.metadata.name}: spec.provider {r.spec.provider!r}"
        for r in unknown[:5]
    )
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    return (
        f"{which}{more}: not a provider of the running system (its last GC sweep, {sweep_id}, "
        f"had: {', '.join(sorted(names))}); use one of those, or add it to the "
        "--providers-config of the executor and GC (apply --no-provider-check skips this check)"
    )
