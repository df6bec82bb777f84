"""The upstream provider with real Squids (D160): the provider contract with the service
unreachable, and every request and CONNECT chained to a recording parent proxy with the
session's login, our lease checked first, the account's password nowhere but in the Squid's
config file."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from events.schemas import InstanceState, ProxySpec
from services.providers.base import CreateRequest, Instance, Permanent
from services.providers.squidauth.keyed import lease_keyed
from services.providers.upstream.provider import (
    COUNTRY_LABEL,
    SESSION_LABEL,
    UpstreamProvider,
)
from services.providers.upstream.pure.templates import NAMED, checked
from tests.contract.provider import (
    MakeRequest,
    ProviderContract,
    Provoke,
    delete_all,
    request_factory,
)
from tests.integration.test_proxy_auth import MASTER, Proxy, lease
from tests.support.clirun import cli, restore_logging_after
from tests.support.loopback import listening
from tests.support.system import processes_mentioning
from tests.support.waiting import until

pytestmark = pytest.mark.integration

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

GRACE = 0.5
WAIT = 30.0
PASSWORD = "s3cr%t #pw$x:y"
"""Every character Squid's config could misread: a space, a ``%``, a ``#``, a ``$``, a ``:``."""


def closed_port() -> int:
    """A loopback port nothing listens on: the service, unreachable."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def upstream(data_dir: Path, port: int, **kwargs: object) -> UpstreamProvider:
    settings: dict[str, object] = {
        "endpoint": ("127.0.0.1", port),
        "templates": NAMED["oxylabs"],
        "password": PASSWORD,
        "allowed_countries": ("de", "fr"),
        "account": "acme",
        "session_seconds": 1800,
        "stop_grace": GRACE,
    }
    settings.update(kwargs)
    return UpstreamProvider("resi", data_dir, **settings)  # type: ignore[arg-type]


def request(name: str, **attributes: str) -> CreateRequest:
    spec = ProxySpec(provider="resi", attributes=attributes)
    return CreateRequest(
        name=name, owner_uid="owner-1", namespace="crawl", proxy_name=name, spec=spec
    )


# ----------------------------------------------------------------------------- contract


class TestUpstreamContract(ProviderContract):
    ready_timeout = WAIT

    @pytest.fixture
    async def provider(self, tmp_path: Path) -> AsyncIterator[UpstreamProvider]:
        provider = upstream(tmp_path / "resi", closed_port())
        yield provider
        await delete_all(provider)
        await provider.close()

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("resi")

    @pytest.fixture
    def provoke(
        self, provider: UpstreamProvider, make_request: MakeRequest, tmp_path: Path
    ) -> Iterator[Provoke]:
        corrupt = provider.data_dir / "instances" / "corrupt"
        corrupt.mkdir(parents=True)
        (corrupt / "meta.json").write_text("{not json")
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            full = upstream(tmp_path / "full", closed_port(), port_range=(port, port))
            city = upstream(
                tmp_path / "city",
                closed_port(),
                templates=checked("u-{account}-{country}-city-{city}-s-{session}"),
            )
            yield [
                (
                    "a country the entry does not allow",
                    lambda: provider.create(request("x", country="us")),
                ),
                ("a city the template needs", lambda: city.create(request("y", country="de"))),
                ("a name that is a path", lambda: provider.create(make_request("../escape"))),
                ("no free port", lambda: full.create(make_request("q1"))),
                ("a corrupt record", lambda: provider.get("corrupt")),
            ]


# ----------------------------------------------------------------------------- the parent


@dataclass
class Parent:
    """A proxy service's gateway, as far as the chaining goes: it records each request's
    line and login, and answers GETs itself and CONNECTs with an established tunnel."""

    port: int = 0
    seen: list[tuple[str, str]] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *headers = head.split("\r\n")
        login = ""
        for header in headers:
            name, _, value = header.partition(":")
            if name.strip().lower() == "proxy-authorization":
                scheme, _, token = value.strip().partition(" ")
                assert scheme == "Basic"
                login = base64.b64decode(token).decode()
        self.seen.append((line, login))
        if line.startswith("CONNECT "):
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            writer.write(await reader.readexactly(5))  # an echo inside the tunnel
        else:
            body = f"parent saw {line}".encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        await writer.drain()
        writer.close()


@pytest.fixture
async def parent() -> AsyncIterator[Parent]:
    found = Parent()
    async with listening(found.handle) as port:
        found.port = port
        yield found


@pytest.fixture
async def resi(tmp_path: Path, parent: Parent) -> AsyncIterator[UpstreamProvider]:
    provider = upstream(tmp_path / "resi", parent.port)
    yield provider
    await delete_all(provider)


async def running(provider: UpstreamProvider, provider_id: str) -> Instance:
    async def is_running() -> bool:
        return (await provider.get(provider_id)).state is InstanceState.RUNNING

    await until(is_running, WAIT, what="Running")
    return await provider.get(provider_id)


async def exchange(port: int, data: bytes, *, read: int = 0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        if read:
            return head + await asyncio.wait_for(reader.readexactly(read), WAIT)
        length = next(
            (
                int(h.split(b":")[1])
                for h in head.split(b"\r\n")
                if h.lower().startswith(b"content-length:")
            ),
            0,
        )
        return head + await asyncio.wait_for(reader.readexactly(length), WAIT)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_requests_and_connects_go_to_the_service_with_the_sessions_login(
    resi: UpstreamProvider, parent: Parent
) -> None:
    instance = await running(resi, await resi.create(request("chain", country="fr")))
    session = instance.labels[SESSION_LABEL]
    assert instance.labels[COUNTRY_LABEL] == "fr"
    assert len(session) == 16
    assert session.isalnum()
    assert session.islower()
    got = await exchange(
        instance.port, b"GET http://site.test/page HTTP/1.1\r\nHost: site.test\r\n\r\n"
    )
    assert got.startswith(b"HTTP/1.1 200"), got
    assert got.endswith(b"parent saw GET http://site.test/page HTTP/1.1")
    # CONNECT to a public address on 443 (the destination rules of every proxy, D134).
    tunnel = await exchange(
        instance.port,
        b"CONNECT 93.184.215.14:443 HTTP/1.1\r\nHost: 93.184.215.14:443\r\n\r\nhello",
        read=5,
    )
    assert tunnel.split(b" ")[1] == b"200", tunnel
    assert tunnel.endswith(b"hello")
    user = f"customer-acme-cc-FR-sessid-{session}-sesstime-30"
    assert parent.seen == [
        ("GET http://site.test/page HTTP/1.1", f"{user}:{PASSWORD}"),
        ("CONNECT 93.184.215.14:443 HTTP/1.1", f"{user}:{PASSWORD}"),
    ]


async def test_each_instance_is_its_own_session_and_a_new_one_after_a_delete(
    resi: UpstreamProvider,
) -> None:
    first = await running(resi, await resi.create(request("s1", country="de")))
    other = await running(resi, await resi.create(request("s2", country="de")))
    assert first.labels[SESSION_LABEL] != other.labels[SESSION_LABEL]
    listed = {i.provider_id: i.labels[SESSION_LABEL] for i in await resi.list_by_tag()}
    assert listed == {"s1": first.labels[SESSION_LABEL], "s2": other.labels[SESSION_LABEL]}
    await resi.delete("s1")
    again = await running(resi, await resi.create(request("s1", country="de")))
    assert again.labels[SESSION_LABEL] not in (
        first.labels[SESSION_LABEL],
        other.labels[SESSION_LABEL],
    )


async def test_our_lease_is_checked_before_anything_reaches_the_service(
    resi: UpstreamProvider, parent: Parent
) -> None:
    keyed = lease_keyed(resi, MASTER)
    uid = str(uuid.uuid4())
    made = dataclasses.replace(request("leased", country="de"), owner_uid=uid)
    instance = await running(resi, await keyed.create(made))
    target = b"GET http://site.test/ HTTP/1.1\r\nHost: site.test\r\n"
    refused = await exchange(instance.port, target + b"\r\n")
    assert refused.startswith(b"HTTP/1.1 407"), refused
    assert parent.seen == []
    url = lease(Proxy(uid, instance.url, resi.data_dir / "instances" / "leased"), 10, 60)
    credentials = url.split("//", 1)[1].rsplit("@", 1)[0]
    token = base64.b64encode(credentials.encode())
    got = await exchange(
        instance.port, target + b"Proxy-Authorization: Basic " + token + b"\r\n\r\n"
    )
    assert got.startswith(b"HTTP/1.1 200"), got
    # The service gets the session's login, never the holder's lease credentials.
    [(_, login)] = parent.seen
    assert login.startswith("customer-acme-cc-DE-sessid-")
    assert login.endswith(f":{PASSWORD}")


async def test_the_password_is_only_in_the_squids_private_config(
    resi: UpstreamProvider, parent: Parent
) -> None:
    instance = await running(resi, await resi.create(request("secret", country="de")))
    instance_dir = resi.data_dir / "instances" / "secret"
    config = instance_dir / "squid.conf"
    assert config.stat().st_mode & 0o777 == 0o600
    assert "login=" in config.read_text()
    written = [p for p in instance_dir.rglob("*") if p.is_file() and p != config]
    assert written  # the record, the lease-less Squid's log
    for path in written:
        content = path.read_bytes()
        assert PASSWORD.encode() not in content, path
        assert quote(PASSWORD, safe="").encode() not in content, path
    pids = processes_mentioning(str(instance_dir))
    assert pids
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()  # noqa: ASYNC240 - procfs
        assert PASSWORD.encode() not in cmdline
        assert quote(PASSWORD, safe="").encode() not in cmdline  # nor escaped
    assert PASSWORD not in repr(instance)
    assert PASSWORD not in repr(resi)
    with pytest.raises(Permanent) as refused:
        await resi.create(request("nowhere", country="us"))
    assert PASSWORD not in str(refused.value)
    assert "'us'" in str(refused.value)
    assert "allowedCountries" in str(refused.value)


async def test_an_unreachable_service_is_an_answer_of_our_squid_not_a_hang(
    tmp_path: Path,
) -> None:
    provider = upstream(tmp_path / "resi", closed_port())
    try:
        instance = await running(provider, await provider.create(request("down", country="de")))
        got = await exchange(
            instance.port, b"GET http://site.test/ HTTP/1.1\r\nHost: site.test\r\n\r\n"
        )
        assert got.split(b" ")[1] in (b"502", b"503"), got
    finally:
        await delete_all(provider)


# ----------------------------------------------------------------------------- preflight


ANSWERS = {
    "taken": b"HTTP/1.1 200 Connection established\r\n\r\n",
    "bad account": (
        b"HTTP/1.1 407 Proxy Authentication Required\r\n"
        b'Proxy-Authenticate: Basic realm="gate"\r\nContent-Length: 0\r\n\r\n'
    ),
    "spent": b"HTTP/1.1 402 Payment Required\r\nContent-Length: 0\r\n\r\n",
    "quota body": (
        b"HTTP/1.1 403 Forbidden\r\nContent-Length: 27\r\n\r\nTraffic limit reached today"
    ),
    "throttled": b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\nContent-Length: 0\r\n\r\n",
    "no http": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
}


@pytest.mark.parametrize(
    ("answer", "verdict", "says"),
    [
        ("taken", True, "let a session in de CONNECT to example.com:443"),
        ("bad account", False, "Permanent: provider resi: the proxy service refused the account"),
        ("spent", False, "QuotaExceeded: provider resi: the proxy service says"),
        ("quota body", False, "QuotaExceeded"),
        ("throttled", False, "Transient: provider resi: the proxy service is throttling"),
        ("no http", False, "Transient"),
    ],
)
async def test_the_preflight_asks_the_gateway_with_a_fresh_sessions_login(
    tmp_path: Path, answer: str, verdict: bool, says: str
) -> None:
    seen: list[str] = []

    async def gateway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await reader.readuntil(b"\r\n\r\n")).decode())
        writer.write(ANSWERS[answer])
        await writer.drain()
        writer.close()

    async with listening(gateway) as port:
        provider = upstream(tmp_path / "resi", port, allowed_countries=("de",))
        [finding] = await provider.preflight()
    assert (finding.check, finding.ok) == ("login for de", verdict)
    assert says in finding.detail
    assert bool(finding.fix) is not verdict
    assert PASSWORD not in finding.detail + finding.fix
    [head] = seen
    assert head.startswith("CONNECT example.com:443 HTTP/1.1\r\n")
    token = head.split("Proxy-Authorization: Basic ")[1].split("\r\n")[0]
    user, _, password = base64.b64decode(token).decode().partition(":")
    assert user.startswith("customer-acme-cc-DE-sessid-")
    assert password == PASSWORD
    assert await provider.list_by_tag() == []  # a probe is no instance


async def test_the_preflight_of_an_unreachable_gateway_says_so(tmp_path: Path) -> None:
    provider = upstream(tmp_path / "resi", closed_port(), allowed_countries=("de", "fr"))
    findings = await provider.preflight()
    assert [(f.check, f.ok) for f in findings] == [("login for de", False), ("login for fr", False)]
    assert "did not answer" in findings[0].detail
    assert "endpoint" in findings[0].fix


async def test_local_stop_stops_the_squids_an_upstream_entry_left(tmp_path: Path) -> None:
    """An upstream entry's Squids outlive `up` as local proxies do; ``local stop`` stops them
    from the providers file alone (no password needed: nothing is built)."""
    data = tmp_path / "data"
    config = tmp_path / "providers.yaml"
    config.write_text(
        "providers:\n  - name: resi\n    type: upstream\n    upstream:\n"
        f"      endpoint: 127.0.0.1:{closed_port()}\n      template: oxylabs\n"
        "      account: acme\n      passwordEnv: NOT_SET_HERE\n      allowedCountries: [de]\n"
    )
    provider = upstream(data.resolve() / "resi", closed_port())
    try:
        await running(provider, await provider.create(request("left", country="de")))
        instance_dir = provider.data_dir / "instances" / "left"
        assert processes_mentioning(str(instance_dir))
        stopped = await cli(
            "local", "stop", "--data-dir", str(data), "--providers-config", str(config)
        )
        assert stopped.exit_code == 0, stopped.output
        assert "stopped the local proxy resi/left" in stopped.stdout
        assert processes_mentioning(str(instance_dir)) == []
    finally:
        await delete_all(provider)
