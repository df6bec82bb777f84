"""libvirt errors → taxonomy: the table per code, and real errors raised by libvirt itself.

The real errors come from libvirt's in-process ``test:///default`` driver (no daemon, no I/O):
the same error reporting code paths as the QEMU driver, so the codes are the ones libvirt sets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import libvirt  # type: ignore[import-untyped, unused-ignore]  # libvirt-python ships no type stubs
import pytest
from structlog.testing import capture_logs

from services.providers.base import (
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.kvm import transport
from services.providers.kvm.pure.classify import VirErr, classify_libvirt
from services.providers.kvm.pure.domain import (
    METADATA_NS,
    METADATA_PREFIX,
    DomainMetadata,
    DomainSpec,
    domain_xml,
    metadata_fragment,
    parse_metadata,
    raw_volume_xml,
)

EXPECTED_NOT_FOUND = {"VIR_ERR_NO_DOMAIN", "VIR_ERR_NO_STORAGE_VOL", "VIR_ERR_NO_DOMAIN_METADATA"}
EXPECTED_PERMANENT = {
    "VIR_ERR_XML_ERROR",
    "VIR_ERR_XML_DETAIL",
    "VIR_ERR_XML_INVALID_SCHEMA",
    "VIR_ERR_NO_NAME",
    "VIR_ERR_NO_OS",
    "VIR_ERR_OS_TYPE",
    "VIR_ERR_NO_SOURCE",
    "VIR_ERR_NO_TARGET",
    "VIR_ERR_INVALID_MAC",
    "VIR_ERR_CONFIG_UNSUPPORTED",
    "VIR_ERR_CPU_INCOMPATIBLE",
    "VIR_ERR_NO_SUPPORT",
    "VIR_ERR_ARGUMENT_UNSUPPORTED",
    "VIR_ERR_OPERATION_UNSUPPORTED",
    "VIR_ERR_INVALID_ARG",
    "VIR_ERR_AUTH_FAILED",
    "VIR_ERR_AUTH_CANCELLED",
    "VIR_ERR_AUTH_UNAVAILABLE",
    "VIR_ERR_OPERATION_DENIED",
    "VIR_ERR_ACCESS_DENIED",
    "VIR_ERR_NO_STORAGE_POOL",
}
# Error levels share the prefix but are not codes (their values collide with real codes).
LEVELS = {"VIR_ERR_NONE", "VIR_ERR_WARNING", "VIR_ERR_ERROR"}
CODES = {
    name: getattr(libvirt, name)
    for name in dir(libvirt)
    if name.startswith("VIR_ERR_") and name not in LEVELS
}


def expected_class(name: str) -> type[ProviderError]:
    if name in EXPECTED_NOT_FOUND:
        return NotFound
    if name in EXPECTED_PERMANENT:
        return Permanent
    return Transient


def test_the_expected_tables_name_real_codes() -> None:
    assert set(CODES) >= EXPECTED_NOT_FOUND | EXPECTED_PERMANENT
    assert len(CODES) > 90  # the installed libvirt's whole list, not a few


@pytest.mark.parametrize("name", sorted(CODES))
def test_every_libvirt_code(name: str) -> None:
    cls = classify_libvirt(CODES[name], "whatever the message says")
    assert cls is expected_class(name)
    assert cls is not QuotaExceeded


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("VIR_ERR_NO_DOMAIN", NotFound),
        ("VIR_ERR_NO_STORAGE_VOL", NotFound),
        ("VIR_ERR_XML_ERROR", Permanent),
        ("VIR_ERR_XML_DETAIL", Permanent),
        ("VIR_ERR_CONFIG_UNSUPPORTED", Permanent),
        ("VIR_ERR_INVALID_ARG", Permanent),
        ("VIR_ERR_AUTH_FAILED", Permanent),
        ("VIR_ERR_OPERATION_DENIED", Permanent),
        ("VIR_ERR_ACCESS_DENIED", Permanent),
        ("VIR_ERR_NO_STORAGE_POOL", Permanent),
        ("VIR_ERR_SYSTEM_ERROR", Transient),
        ("VIR_ERR_RPC", Transient),
        ("VIR_ERR_NO_CONNECT", Transient),
        ("VIR_ERR_OPERATION_TIMEOUT", Transient),
        ("VIR_ERR_INTERNAL_ERROR", Transient),
        ("VIR_ERR_OPERATION_FAILED", Transient),
        ("VIR_ERR_OPERATION_INVALID", Transient),
        ("VIR_ERR_AGENT_UNRESPONSIVE", Transient),
        ("VIR_ERR_RESOURCE_BUSY", Transient),
        ("VIR_ERR_NO_MEMORY", Transient),
    ],
)
def test_the_rules_of_the_issue(name: str, cls: type[ProviderError]) -> None:
    assert classify_libvirt(getattr(libvirt, name), "") is cls


@pytest.mark.parametrize("code", list(VirErr), ids=lambda c: c.name)
def test_our_codes_are_libvirts(code: VirErr) -> None:
    """The pure module writes libvirt's numbers down; the binding is the authority on them."""
    assert code == getattr(libvirt, f"VIR_ERR_{code.name}")


def test_unknown_codes_are_transient() -> None:
    assert classify_libvirt(max(CODES.values()) + 1000, "from a newer libvirt") is Transient
    assert classify_libvirt(0, "") is Transient


# ----------------------------------------------------------------------------- real errors


@pytest.fixture
def conn() -> Iterator[libvirt.virConnect]:
    # libvirt prints every error to stderr unless a handler takes them.
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    connection = libvirt.open("test:///default")
    try:
        yield connection
    finally:
        # The default test driver's state is shared by the whole process: leave it as found.
        for domain in connection.listAllDomains():
            if domain.name() != "test":
                domain.undefine()
        for volume in connection.storagePoolLookupByName("default-pool").listAllVolumes():
            volume.delete()
        connection.close()
        libvirt.registerErrorHandler(None, None)


def spec(name: str) -> DomainSpec:
    return DomainSpec(
        name=name,
        vcpus=1,
        memory_mib=256,
        domain_type="kvm",
        pool="default-pool",
        disk_volume=f"{name}.qcow2",
        seed_volume=f"{name}-seed.iso",
        bridge="br0",
        owner_uid="uid-1",
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


THEIRS = (
    "<domain type='test'><name>theirs</name><memory>1024</memory><os><type>hvm</type></os></domain>"
)


def raised(call: Callable[[], object]) -> libvirt.libvirtError:
    with pytest.raises(libvirt.libvirtError) as caught:
        call()
    return caught.value


def test_real_errors_are_classified(conn: libvirt.virConnect) -> None:
    pool = conn.storagePoolLookupByName("default-pool")
    stock = conn.defineXML(THEIRS)
    mine = conn.defineXML(domain_xml(spec("px-a")))
    cases: list[tuple[Callable[[], object], type[ProviderError]]] = [
        (lambda: conn.lookupByName("px-none"), NotFound),
        (lambda: pool.storageVolLookupByName("px-none.qcow2"), NotFound),
        (lambda: stock.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS), NotFound),
        (lambda: conn.storagePoolLookupByName("no-such-pool"), Permanent),
        (lambda: conn.defineXML("<domain"), Permanent),
        (lambda: conn.defineXML(domain_xml(spec("px-b")).replace('"sata"', '"bogus"')), Permanent),
        (lambda: conn.lookupByID(-5), Permanent),
        (mine.destroy, Transient),  # not running: the caller decides it is fine
        (lambda: pool.createXML(raw_volume_xml("dup.iso", 2048), 0), Transient),
    ]
    pool.createXML(raw_volume_xml("dup.iso", 2048), 0)
    for call, cls in cases:
        error = transport.wrap_libvirt(raised(call), "doing it")
        assert type(error) is cls, f"{error!r}"
        assert str(error).startswith("doing it: ")


def test_a_dead_socket_is_transient() -> None:
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    try:
        exc = raised(lambda: libvirt.open("qemu+unix:///system?socket=/nonexistent/libvirt-sock"))
    finally:
        libvirt.registerErrorHandler(None, None)
    assert type(transport.wrap_libvirt(exc, "connect")) is Transient


def test_an_error_without_details_is_transient() -> None:
    libvirt.virResetLastError()  # the constructor reads this thread's last error
    error = transport.wrap_libvirt(libvirt.libvirtError("virSomething() failed"), "something")
    assert type(error) is Transient
    assert str(error) == "something: virSomething() failed"


def test_raw_code_and_domain_are_logged_at_debug(conn: libvirt.virConnect) -> None:
    exc = raised(lambda: conn.lookupByName("px-none"))
    with capture_logs() as logs:
        transport.wrap_libvirt(exc, "lookup px-none")
    assert logs == [
        {
            "event": "libvirt error",
            "log_level": "debug",
            "what": "lookup px-none",
            "code": libvirt.VIR_ERR_NO_DOMAIN,
            "domain": exc.get_error_domain(),
            "level": exc.get_error_level(),
            "message": exc.get_error_message(),
            "result": "NotFound",
        }
    ]


# ------------------------------------------------------------------------ libvirt reads our XML


def test_libvirt_keeps_our_metadata(conn: libvirt.virConnect) -> None:
    expected = DomainMetadata(True, "uid-1", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    domain = conn.defineXML(domain_xml(spec("px-a")))
    assert parse_metadata(domain.XMLDesc(0)) == expected
    assert parse_metadata(domain.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS)) == (
        expected
    )
    stock = conn.defineXML(THEIRS)
    assert parse_metadata(stock.XMLDesc(0)) is None
    later = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    stock.setMetadata(
        libvirt.VIR_DOMAIN_METADATA_ELEMENT,
        metadata_fragment("uid-2", later),
        METADATA_PREFIX,
        METADATA_NS,
        0,
    )
    assert parse_metadata(stock.XMLDesc(0)) == DomainMetadata(True, "uid-2", later)
    assert parse_metadata(stock.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, METADATA_NS)) == (
        DomainMetadata(True, "uid-2", later)
    )


def test_libvirt_keeps_our_devices(conn: libvirt.virConnect) -> None:
    xml = conn.defineXML(domain_xml(spec("px-a"))).XMLDesc(0)
    for fragment in (
        "<source pool='default-pool' volume='px-a.qcow2'/>",
        "<source pool='default-pool' volume='px-a-seed.iso'/>",
        "<target dev='sda' bus='sata'/>",
        "<source bridge='br0'/>",
        "<model type='virtio'/>",
        "<target type='virtio' name='org.qemu.guest_agent.0'/>",
        "<backend model='random'>/dev/urandom</backend>",
        "<cpu mode='host-passthrough' check='none' migratable='on'/>",
        "<memory unit='KiB'>262144</memory>",
        "machine='q35'",
    ):
        assert fragment in xml
    assert "<graphics" not in xml


def test_volume_capacities_are_bytes(conn: libvirt.virConnect) -> None:
    pool = conn.storagePoolLookupByName("default-pool")
    volume = pool.createXML(raw_volume_xml("px-a-seed.iso", 67_584), 0)
    assert volume.info()[1] == 67_584
