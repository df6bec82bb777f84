"""Where a leased proxy lets its holder go
(docs/decisions/0134-where-a-proxy-lets-its-holder-go.md).

Every provider's generated Squid configuration, run by a real Squid: the local provider's (with
leases enforced, through a holder's credentials), the kubernetes pod's, the cloud VM's
``squid.conf`` and Debian's default ``squid.conf`` with the gcp/kvm ``conf.d`` snippet. Each
refusal is Squid's own (403, ``ERR_ACCESS_DENIED``) and nothing reaches the listener, whatever
the spelling of the address; what ``allowedTargets`` lists is reached; and a site receives the
headers the client sent, in the client's order, with nothing of the proxy's added.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from services.providers.cloud.pure.guard import OWN_ADDRESSES, vm_snippet
from services.providers.cloud.pure.settings import CloudSettings
from services.providers.cloud.pure.userdata import squid_script
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.pure import mapping
from services.providers.local import LocalProvider
from services.providers.pure.targets import AllowedTarget
from services.providers.squidauth.keyed import lease_keyed
from tests.integration.test_proxy_auth import MASTER, lease, start
from tests.support.squid_fixtures import local_squids, origin_url  # noqa: F401  # fixtures `local` and `target`
from tests.support.squid_rules import (
    Listener,
    ask,
    loopback_listen,
    recording,
    squid_running,
    squid_workdir,
)

pytestmark = pytest.mark.reliability

DEBIAN_CONF = Path("/etc/squid/squid.conf")
HOSTS = "127.0.0.1 localhost inside.test\n::1 localhost inside6.test\n"
"""Squid's own hosts file in these tests: names that resolve to loopback."""
INSIDE = [
    "127.0.0.1",
    "127.1",
    "2130706433",  # decimal
    "0177.0.0.1",  # octal
    "0x7f.0.0.1",
    "0",
    "0.0.0.0",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::1]",
    "[::]",
    "localhost",
    "localhost.",
    "inside.test",
    "inside6.test",
    "10.0.0.1",
    "100.64.0.1",
    "172.16.0.1",
    "192.168.0.1",
    "[fc00::1]",
    "[64:ff9b::7f00:1]",
]
"""Every spelling a strict proxy refuses; the port is the listener's."""
NEVER = [
    "169.254.169.254",
    "169.254.170.2",
    "[fd00:ec2::254]",
    "[fe80::1]",
    "metadata.google.internal",
    "metadata",
]
"""Refused by every proxy, the local provider's included."""
METADATA_TRICKS = [
    (
        "PUT http://169.254.169.254/latest/api/token HTTP/1.1",
        [("Host", "169.254.169.254"), ("X-aws-ec2-metadata-token-ttl-seconds", "21600")],
    ),
    (
        "GET http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
        "user-data HTTP/1.1",
        [("Host", "metadata.google.internal"), ("Metadata-Flavor", "Google")],
    ),
    ("GET http://metadata/computeMetadata/v1/ HTTP/1.1", [("Host", "metadata")]),
    ("CONNECT 169.254.169.254:443 HTTP/1.1", [("Host", "169.254.169.254:443")]),
]


def refused(proxy: str, line: str, headers: list[tuple[str, str]]) -> None:
    answer = ask(proxy, line, headers)
    assert (answer.status, answer.squid_error) == (403, "ERR_ACCESS_DENIED"), line


def refuses_everything_inside(proxy: str, port: int, *, loopback_http: bool = False) -> None:
    for host in NEVER + ([] if loopback_http else INSIDE):
        refused(proxy, f"GET http://{host}:{port}/ HTTP/1.1", [("Host", f"{host}:{port}")])
    for host in NEVER + INSIDE:
        refused(proxy, f"CONNECT {host}:{port} HTTP/1.1", [("Host", f"{host}:{port}")])
    for line, headers in METADATA_TRICKS:
        refused(proxy, line, headers)


# ------------------------------------------------------------------ each provider's config


def kubernetes_config(workdir: Path, targets: tuple[AllowedTarget, ...] = ()) -> str:
    listen = loopback_listen()
    config = KubernetesConfig(allowed_clients=("127.0.0.1/32",), allowed_targets=targets)
    text = mapping.squid_config(config, "px-k8s")
    text = text.replace(f"http_port {config.port}\n", f"http_port {listen}\n")
    return text + f"hosts_file {hosts(workdir)}\n"


def cloud_config(
    workdir: Path, targets: tuple[AllowedTarget, ...] = (), own: str = "192.0.2.10\n"
) -> str:
    """The ``squid.conf`` the cloud VMs' user data writes, with its paths moved here."""
    listen = loopback_listen()
    settings = msgspec.convert(
        {"allowedClients": ["127.0.0.1/32"], "allowedTargets": msgspec.to_builtins(targets)},
        CloudSettings,
    )
    script = squid_script(settings, "px-cloud")
    found = re.search(r"<<'(\w+)'\n(.*?)\n\1\n", script, re.DOTALL)
    assert found, "the script writes squid.conf from a heredoc"
    (workdir / "conf.d").mkdir(parents=True, exist_ok=True)
    (workdir / "conf.d" / "empty.conf").write_text("")
    (workdir / "own").write_text(own)
    text = (
        found[2]
        .replace("http_port 3128\n", f"http_port {listen}\n")
        .replace("/var/log/squid/cache.log", str(workdir / "cache.log"))
        .replace("/run/squid.pid", str(workdir / "squid.pid"))
        .replace("/etc/squid/conf.d/", f"{workdir}/conf.d/")
        .replace(OWN_ADDRESSES, str(workdir / "own"))
    )
    return text + f"\nhosts_file {hosts(workdir)}\n"


def debian_config(workdir: Path, targets: tuple[AllowedTarget, ...] = ()) -> str:
    """Debian's default ``squid.conf`` with the gcp/kvm snippet in its ``conf.d``."""
    # deploy/host-packages.sh installs Debian's squid, which ships this file: its absence is a
    # broken set-up, not a reason to test less.
    assert DEBIAN_CONF.exists(), f"{DEBIAN_CONF} is missing: run sh deploy/host-packages.sh test"
    (workdir / "conf.d").mkdir(parents=True, exist_ok=True)
    (workdir / "own").write_text("192.0.2.10\n")
    snippet = vm_snippet(targets).replace(OWN_ADDRESSES, str(workdir / "own"))
    (workdir / "conf.d" / "00-egress-targets.conf").write_text(snippet)
    text = DEBIAN_CONF.read_text()
    assert "\nhttp_port 3128\n" in text
    text = text.replace("\nhttp_port 3128\n", f"\nhttp_port {loopback_listen()}\n").replace(
        "/etc/squid/conf.d/", f"{workdir}/conf.d/"
    )
    extra = (
        f"pid_filename none\ncache_log {workdir}/cache.log\naccess_log none\n"
        "shutdown_lifetime 0 seconds\n"
    )
    return text + "\n" + extra + f"hosts_file {hosts(workdir)}\n"


def hosts(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "hosts"
    path.write_text(HOSTS)
    return path


CONFIGS = {"kubernetes": kubernetes_config, "cloud": cloud_config, "debian": debian_config}


@pytest.fixture
def workdir() -> Iterator[Path]:
    with squid_workdir() as path:
        yield path


@pytest.fixture
def listener() -> Iterator[Listener]:
    with recording("127.0.0.1") as found:
        yield found


@pytest.fixture
def listed() -> Iterator[Listener]:
    """A listener on another loopback address, for an entry of ``allowedTargets``."""
    with recording("127.0.0.2") as found:
        yield found


# ------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_strict_proxy_reaches_nothing_inside_however_spelt(
    kind: str, workdir: Path, listener: Listener
) -> None:
    with squid_running(CONFIGS[kind](workdir), workdir) as proxy:
        refuses_everything_inside(proxy, listener.port)
    assert listener.accepted == 0


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_allowed_targets_open_exactly_the_listed_range_and_ports(
    kind: str, workdir: Path, listener: Listener, listed: Listener
) -> None:
    entry = AllowedTarget(cidr="127.0.0.2/32", ports=(listed.port,))
    with squid_running(CONFIGS[kind](workdir, (entry,)), workdir) as proxy:
        url = f"127.0.0.2:{listed.port}"
        assert ask(proxy, f"GET http://{url}/ HTTP/1.1", [("Host", url)]).status == 200
        if kind != "debian":  # Debian's squid.conf refuses CONNECT beyond 443 before conf.d
            assert ask(proxy, f"CONNECT {url} HTTP/1.1", [("Host", url)]).status == 200
        # The same address on another port, and the rest of loopback, stay refused.
        other = f"127.0.0.2:{listener.port}"
        refused(proxy, f"GET http://{other}/ HTTP/1.1", [("Host", other)])
        refuses_everything_inside(proxy, listener.port)
    assert listener.accepted == 0
    assert listed.accepted == (1 if kind == "debian" else 2)


def test_a_vm_never_reaches_its_own_addresses_even_when_listed(
    workdir: Path, listener: Listener, listed: Listener
) -> None:
    everything = AllowedTarget(cidr="127.0.0.0/8", ports=("1024-65535",))
    config = cloud_config(workdir, (everything,), own="127.0.0.1\n")
    with squid_running(config, workdir) as proxy:
        mine = f"127.0.0.1:{listener.port}"
        refused(proxy, f"GET http://{mine}/ HTTP/1.1", [("Host", mine)])
        refused(proxy, f"CONNECT {mine} HTTP/1.1", [("Host", mine)])
        other = f"127.0.0.2:{listed.port}"
        assert ask(proxy, f"GET http://{other}/ HTTP/1.1", [("Host", other)]).status == 200
    assert (listener.accepted, listed.accepted) == (0, 1)


async def test_a_holder_of_a_local_proxy_reaches_loopback_http_only(
    local: LocalProvider, target: str, listener: Listener
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-where")
    holder = lease(proxy, 10, 300)
    assert (await asyncio.to_thread(ask, holder, f"GET {target} HTTP/1.1")).status == 200
    await asyncio.to_thread(refuses_everything_inside, holder, listener.port, loopback_http=True)
    # The tunnel to the host's nats-server port, by every loopback spelling.
    for host in ("127.0.0.1", "localhost", "[::1]", "2130706433"):
        authority = f"{host}:{listener.port}"
        await asyncio.to_thread(
            refused, holder, f"CONNECT {authority} HTTP/1.1", [("Host", authority)]
        )
    assert listener.accepted == 0


# -------------------------------------------------------------------------------- headers

SENT = [
    ("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) crawler/1.0"),
    ("Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8"),
    ("Accept-Language", "en-GB,en;q=0.7"),
    ("X-Zeta", "last letter first"),
    ("Cookie", "a=b; c=d"),
    ("X-Alpha", "1"),
]


def received(head: bytes) -> list[tuple[str, str]]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = [line.split(":", 1) for line in lines if line]
    return [(name, value.strip()) for name, value in pairs]


def through(proxy: str, listener: Listener, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    url = f"{listener.host}:{listener.port}"
    before = len(listener.heads)
    sent = [("Host", url), *SENT, *extra]
    assert ask(proxy, f"GET http://{url}/page?q=1 HTTP/1.1", sent).status == 200
    assert len(listener.heads) == before + 1
    assert listener.heads[-1].startswith(b"GET /page?q=1 HTTP/1.1\r\n")
    return received(listener.heads[-1])


def exactly_as_sent(proxy: str, listener: Listener) -> None:
    """What Squid changes and cannot be told not to: it writes ``Host`` after the client's
    other headers and ``Cache-Control`` after ``Host`` (directives in its own order), and
    speaks its own ``Connection`` to the site (hop-by-hop). Everything else arrives as sent, in
    order."""
    host = f"{listener.host}:{listener.port}"
    expected = [*SENT, ("Host", host), ("Connection", "keep-alive")]
    assert through(proxy, listener, []) == expected
    # A client's own Cache-Control that Squid leaves alone arrives as sent (its directives
    # in Squid's order: it parses and writes the header again).
    for value in ("max-age=0", "no-cache", "no-transform, max-age=0"):
        got = through(proxy, listener, [("Cache-Control", value)])
        assert got == [
            *SENT,
            ("Host", host),
            ("Cache-Control", value),
            ("Connection", "keep-alive"),
        ]
    # One Squid would append max-age to is not forwarded at all (D134's limit).
    assert through(proxy, listener, [("Cache-Control", "no-store")]) == expected


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_site_receives_the_headers_the_client_sent(
    kind: str, workdir: Path, listed: Listener
) -> None:
    entry = AllowedTarget(cidr="127.0.0.2/32", ports=(listed.port,))
    with squid_running(CONFIGS[kind](workdir, (entry,)), workdir) as proxy:
        exactly_as_sent(proxy, listed)


async def test_a_site_receives_the_headers_a_local_proxys_holder_sent(
    local: LocalProvider, listener: Listener
) -> None:
    proxy = await start(lease_keyed(local, MASTER), local, "px-headers")
    holder = lease(proxy, 10, 300)
    await asyncio.to_thread(exactly_as_sent, holder, listener)
