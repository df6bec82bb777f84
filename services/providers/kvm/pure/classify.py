"""libvirt errors → the provider taxonomy, from libvirt's error code alone.

A code names what went wrong precisely (no such domain, bad XML, denied), messages are for people
and change between releases, so messages are never matched. Only a failure that retrying cannot
cure is Permanent: the definition or the host's configuration is wrong (bad XML, a feature the
host lacks, a missing pool, refused credentials). Everything else, including every connection and
RPC failure and a daemon busy or timing out, is Transient. libvirt has no quotas, so nothing is
QuotaExceeded; a host out of memory fails to start the domain, which a retry may cure.

The codes are libvirt's stable ABI numbers (``virErrorNumber`` in virterror.h), written here so
that deciding needs no libvirt import; a unit test checks each against the binding's constant.
The libvirt exception itself is unwrapped where libvirt is called (``transport``).
"""

from __future__ import annotations

from enum import IntEnum

from services.providers.base import NotFound, Permanent, ProviderError, Transient


class VirErr(IntEnum):
    """The ``VIR_ERR_*`` codes this module decides on (the name without the prefix)."""

    NO_SUPPORT = 3
    INVALID_ARG = 8
    OS_TYPE = 16
    NO_SOURCE = 19
    NO_TARGET = 20
    NO_NAME = 21
    NO_OS = 22
    XML_ERROR = 27
    OPERATION_DENIED = 29
    XML_DETAIL = 35
    NO_DOMAIN = 42
    INVALID_MAC = 44
    AUTH_FAILED = 45
    NO_STORAGE_POOL = 49
    NO_STORAGE_VOL = 50
    CONFIG_UNSUPPORTED = 67
    ARGUMENT_UNSUPPORTED = 74
    AUTH_CANCELLED = 79
    NO_DOMAIN_METADATA = 80
    OPERATION_UNSUPPORTED = 84
    ACCESS_DENIED = 88
    CPU_INCOMPATIBLE = 91
    XML_INVALID_SCHEMA = 92
    AUTH_UNAVAILABLE = 94


NOT_FOUND_CODES = frozenset(
    {
        VirErr.NO_DOMAIN,
        VirErr.NO_STORAGE_VOL,
        # Asking a domain for our metadata when it has none: not an instance of ours.
        VirErr.NO_DOMAIN_METADATA,
    }
)

PERMANENT_CODES = frozenset(
    {
        # The definition is not valid libvirt XML.
        VirErr.XML_ERROR,
        VirErr.XML_DETAIL,
        VirErr.XML_INVALID_SCHEMA,
        VirErr.NO_NAME,
        VirErr.NO_OS,
        VirErr.OS_TYPE,
        VirErr.NO_SOURCE,
        VirErr.NO_TARGET,
        VirErr.INVALID_MAC,
        # The host cannot run it (e.g. domainType kvm without /dev/kvm, a CPU it lacks).
        VirErr.CONFIG_UNSUPPORTED,
        VirErr.CPU_INCOMPATIBLE,
        VirErr.NO_SUPPORT,
        VirErr.ARGUMENT_UNSUPPORTED,
        VirErr.OPERATION_UNSUPPORTED,
        VirErr.INVALID_ARG,
        # The SSH user may not manage libvirt there.
        VirErr.AUTH_FAILED,
        VirErr.AUTH_CANCELLED,
        VirErr.AUTH_UNAVAILABLE,
        VirErr.OPERATION_DENIED,
        VirErr.ACCESS_DENIED,
        # kvm.hosts[].pool names no pool on that host.
        VirErr.NO_STORAGE_POOL,
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
