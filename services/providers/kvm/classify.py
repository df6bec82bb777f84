"""libvirt errors → the provider taxonomy, from libvirt's error code alone.

A code names what went wrong precisely (no such domain, bad XML, denied), messages are for people
and change between releases, so messages are never matched. Only a failure that retrying cannot
cure is Permanent: the definition or the host's configuration is wrong (bad XML, a feature the
host lacks, a missing pool, refused credentials). Everything else, including every connection and
RPC failure and a daemon busy or timing out, is Transient. libvirt has no quotas, so nothing is
QuotaExceeded; a host out of memory fails to start the domain, which a retry may cure.
"""

from __future__ import annotations

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import structlog

from services.providers.base import NotFound, Permanent, ProviderError, Transient

log = structlog.get_logger("egress.provider.kvm")

NOT_FOUND_CODES = frozenset(
    {
        libvirt.VIR_ERR_NO_DOMAIN,
        libvirt.VIR_ERR_NO_STORAGE_VOL,
        # Asking a domain for our metadata when it has none: not an instance of ours.
        libvirt.VIR_ERR_NO_DOMAIN_METADATA,
    }
)

PERMANENT_CODES = frozenset(
    {
        # The definition is not valid libvirt XML.
        libvirt.VIR_ERR_XML_ERROR,
        libvirt.VIR_ERR_XML_DETAIL,
        libvirt.VIR_ERR_XML_INVALID_SCHEMA,
        libvirt.VIR_ERR_NO_NAME,
        libvirt.VIR_ERR_NO_OS,
        libvirt.VIR_ERR_OS_TYPE,
        libvirt.VIR_ERR_NO_SOURCE,
        libvirt.VIR_ERR_NO_TARGET,
        libvirt.VIR_ERR_INVALID_MAC,
        # The host cannot run it (e.g. domainType kvm without /dev/kvm, a CPU it lacks).
        libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        libvirt.VIR_ERR_CPU_INCOMPATIBLE,
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
        libvirt.VIR_ERR_INVALID_ARG,
        # The SSH user may not manage libvirt there.
        libvirt.VIR_ERR_AUTH_FAILED,
        libvirt.VIR_ERR_AUTH_CANCELLED,
        libvirt.VIR_ERR_AUTH_UNAVAILABLE,
        libvirt.VIR_ERR_OPERATION_DENIED,
        libvirt.VIR_ERR_ACCESS_DENIED,
        # kvm.hosts[].pool names no pool on that host.
        libvirt.VIR_ERR_NO_STORAGE_POOL,
    }
)


def classify_libvirt(code: int, message: str) -> type[ProviderError]:
    """The class for a libvirt error code; ``message`` is for the caller's text only."""
    del message  # messages change between libvirt releases: never decide on them
    if code in NOT_FOUND_CODES:
        return NotFound
    if code in PERMANENT_CODES:
        return Permanent
    return Transient


def wrap_libvirt(exc: libvirt.libvirtError, what: str) -> ProviderError:
    """The taxonomy error for ``exc`` saying what was being done; the caller raises it
    ``from exc`` so the original stays in the logs."""
    code = exc.get_error_code() or 0
    message = exc.get_error_message() or str(exc)
    cls = classify_libvirt(code, message)
    log.debug(
        "libvirt error",
        what=what,
        code=code,
        domain=exc.get_error_domain(),
        level=exc.get_error_level(),
        message=message,
        result=cls.__name__,
    )
    return cls(f"{what}: {message}")
