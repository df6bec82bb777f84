"""Real crawler clients through the gateway of `up` (docs/gateway.md): curl, httpx, requests,
Scrapy with its own proxy middleware, and headless Chromium, over HTTP and HTTPS, each logging
in with its client's name (and parameters) and token from `up --clients-file`.

The fleet is three local proxies, real Squids enforcing their leases, each on a provider of its
own leaving from its own loopback address, so the site (tests/support/egress_site.py) sees
which proxy a request took as a real site sees a proxy's public address. The Squids let
`CONNECT` reach the site's TLS port because the providers' ``allowedTargets`` list it
(docs/providers.md, "Where a proxy lets its holder go"); loopback `CONNECT` is otherwise open
on 443 only.

How the site tells the exits apart and how Chromium logs in:
docs/decisions/0157-the-gateway-in-up-and-real-clients-through-it.md. One `up` serves the whole
story, in one test: xdist hands each test of a module to any worker, so a module fixture would
start an `up` per worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.support.egress_site import BLOCKED, EgressSite, egress_site
from tests.support.gateway import TOKENS, gateway_clients, proxy_url
from tests.support.system import ROOT, Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXITS = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}
CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"


def providers(tmp_path: Path, tls_port: int) -> str:
    listed = f"allowedTargets: [{{cidr: 127.0.0.1/32, ports: [{tls_port}]}}]"
    lines = ["providers:"]
    for name, address in EXITS.items():
        folder = tmp_path / "instances" / name
        lines.append(
            f"  - {{name: exit-{name}, type: local, local: "
            f'{{dataDir: "{folder}", outgoingAddress: {address}, {listed}}}}}'
        )
    return "\n".join(lines) + "\n"


MANIFESTS = "---\n".join(
    f"""apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: exit-{name}, namespace: crawl}}
spec:
  provider: exit-{name}
  attributes: {{country: de, exit: {name}}}
"""
    for name in EXITS
)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without proxy variables (a ``no_proxy`` naming loopback would send a
    client around the gateway), plus ``extra``."""
    proxies = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    env = {k: v for k, v in os.environ.items() if k.lower() not in proxies}
    return {**env, **extra}


async def test_real_clients_fetch_through_the_gateway_of_up(tmp_path: Path) -> None:
    clients = gateway_clients(tmp_path / "clients.yaml")
    with egress_site(tmp_path) as site, hello_target() as target:
        config = tmp_path / "providers.yaml"
        config.write_text(providers(tmp_path, site.https_port))
        manifest = tmp_path / "proxies.yaml"
        manifest.write_text(MANIFESTS)
        flags = [
            *("--providers-config", str(config), "--clients-file", str(clients)),
            *("--observe-interval", "1", "--lease-cooldown", "0s"),
            *("--rotating-leases", "3", "--rotating-idle", "1s"),
        ]
        local_dirs = [tmp_path / "instances" / name for name in EXITS]
        async with running_up(
            tmp_path, *flags, health_check_url=target, local_dirs=local_dirs
        ) as up:
            applied = await up.cli("apply", "-f", str(manifest), "--wait")
            assert applied.returncode == 0, applied.stdout + applied.stderr
            await until(lambda: _all_leasable(up), timeout=60, what="three proxies leasable")
            port = up.gateway_port
            await _refused_without_login(site, port)
            # Each client in turn, once the one before has let its leases go: a step whose
            # user name names an exit finds that proxy free.
            for step in (_curl_step, _httpx_step, _requests_step, _scrapy_step, _chromium_step):
                await step(site, port)
                await _released(up, "crawler-a", after=step.__name__)
            await _sticky_session(site, port)
            await _released(up, "crawler-b", after="the session's step")
            await _blocked_target_moves_on(site, port)


async def _all_leasable(up: Up) -> bool:
    def listed() -> list[bool]:
        answer = httpx.get(
            f"{up.api}/v1/proxies",
            headers={"Authorization": f"Bearer {TOKENS['crawler-a']}"},
            timeout=10,
        )
        return [p["available"] for p in answer.json()["items"]]

    return await asyncio.to_thread(listed) == [True] * len(EXITS)


async def _released(up: Up, client: str, *, after: str) -> None:
    """Wait until ``client``'s rotating leases are let go: the gateway releases them after
    ``--rotating-idle``, so the next step finds the proxies free."""

    def none_held() -> bool:
        answer = httpx.get(
            f"{up.api}/v1/leases",
            params={"holder": "gateway/rotating"},
            headers={"Authorization": f"Bearer {TOKENS[client]}"},
            timeout=10,
        )
        return not answer.json()["items"]

    await until(
        lambda: asyncio.to_thread(none_held), timeout=60, what=f"{client}'s leases let go {after}"
    )


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=clean_env(),
    )


async def _refused_without_login(site: EgressSite, port: int) -> None:
    """With a clients file, the gateway asks for a login, and a wrong token is refused."""
    bare = await asyncio.to_thread(
        _curl, "-i", "-x", f"http://127.0.0.1:{port}", site.url("/nobody")
    )
    assert bare.stdout.startswith("HTTP/1.1 407"), bare.stdout + bare.stderr
    assert "proxy login" in bare.stdout
    wrong = await asyncio.to_thread(
        _curl, "-i", "-x", f"http://crawler-a:{'x' * 40}@127.0.0.1:{port}", site.url("/nobody")
    )
    assert wrong.stdout.startswith("HTTP/1.1 407"), wrong.stdout + wrong.stderr
    assert site.seen("/nobody") == []


def _through_a_proxy(site: EgressSite, path: str, scheme: str, body: str) -> None:
    """The site saw the request once, from one of the proxies' addresses, and the client got
    what the site sent."""
    visits = [v for v in site.seen(path) if v.scheme == scheme]
    assert len(visits) == 1, site.seen(path)
    assert visits[0].address in EXITS.values(), visits
    assert body == f"{scheme} {path} seen from {visits[0].address}\n", body


async def _curl_step(site: EgressSite, port: int) -> None:
    """curl, as the user guide writes it: ``-x http://crawler-a:TOKEN@host:port``, the user
    name carrying parameters or not."""
    for user, tls in (("crawler-a", False), ("crawler-a-country-de", True)):
        path = f"/curl/{user}"
        extra = ["--cacert", str(site.ca_file)] if tls else []
        got = await asyncio.to_thread(
            _curl, *extra, "-x", proxy_url(port, user), site.url(path, tls=tls)
        )
        assert got.returncode == 0, got.stderr
        _through_a_proxy(site, path, "https" if tls else "http", got.stdout)


async def _httpx_step(site: EgressSite, port: int) -> None:
    """httpx with the proxy URL, its user name naming the exit."""
    async with httpx.AsyncClient(
        proxy=proxy_url(port, "crawler-a-exit-b"),
        verify=ssl.create_default_context(cafile=site.ca_file),
        trust_env=False,
    ) as http:
        for tls in (False, True):
            answer = await http.get(site.url("/httpx", tls=tls), timeout=20)
            assert answer.status_code == 200, answer.text
            if not tls:  # a tunnel's head is the CONNECT answer, which httpx keeps to itself
                assert answer.headers["x-egress-proxy"] == "crawl/exit-b"
    visits = site.seen("/httpx")
    assert sorted((v.scheme, v.address) for v in visits) == [
        ("http", EXITS["b"]),
        ("https", EXITS["b"]),
    ], visits


async def _requests_step(site: EgressSite, port: int) -> None:
    def fetch() -> None:
        with requests.Session() as session:
            session.trust_env = False
            session.proxies = dict.fromkeys(("http", "https"), proxy_url(port, "crawler-a"))
            for tls in (False, True):
                answer = session.get(
                    site.url("/requests", tls=tls), verify=str(site.ca_file), timeout=20
                )
                assert answer.status_code == 200, answer.text
                _through_a_proxy(site, "/requests", "https" if tls else "http", answer.text)

    await asyncio.to_thread(fetch)


async def _scrapy_step(site: EgressSite, port: int) -> None:
    """Scrapy through its own HttpProxyMiddleware, with ``meta["proxy"]`` and with the
    ``http_proxy``/``https_proxy`` environment, each user name naming an exit."""
    meta = proxy_url(port, "crawler-a-exit-c")
    asks = [
        {"url": site.url("/scrapy/meta"), "proxy": meta},
        {"url": site.url("/scrapy/meta", tls=True), "proxy": meta},
        {"url": site.url("/scrapy/env")},
        {"url": site.url("/scrapy/env", tls=True)},
    ]
    from_env = proxy_url(port, "crawler-a-exit-a")
    env = clean_env(PYTHONPATH=str(ROOT), http_proxy=from_env, https_proxy=from_env)
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "tests.support.gateway_spider", json.dumps(asks)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        env=env,
        cwd=ROOT,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    assert [a["status"] for a in answers] == [200] * 4, [a for a in answers if a["status"] != 200]
    for path, exit_ in (("/scrapy/meta", "c"), ("/scrapy/env", "a")):
        visits = site.seen(path)
        assert sorted((v.scheme, v.address) for v in visits) == [
            ("http", EXITS[exit_]),
            ("https", EXITS[exit_]),
        ], visits
        for scheme in ("http", "https"):
            assert _body(answers, path, scheme) == f"{scheme} {path} seen from {EXITS[exit_]}\n"
    plain = [a["proxy"] for a in answers if a["url"].startswith("http:")]
    assert sorted(plain) == ["crawl/exit-a", "crawl/exit-c"], answers


def _body(answers: list[dict[str, str]], path: str, scheme: str) -> str:
    return next(
        a["body"] for a in answers if a["url"].startswith(scheme + ":") and path in a["url"]
    )


LOGIN_EXTENSION = {
    "manifest_version": 3,
    "name": "gateway login",
    "version": "1",
    "permissions": ["webRequest", "webRequestAuthProvider"],
    "host_permissions": ["<all_urls>"],
    "background": {"service_worker": "login.js"},
}
LOGIN_SCRIPT = """chrome.webRequest.onAuthRequired.addListener(
  (details, answer) => answer(details.isProxy ? {authCredentials: %s} : {}),
  {urls: ["<all_urls>"]}, ["asyncBlocking"]);
"""


def login_extension(folder: Path, user: str, token: str) -> Path:
    """A browser extension that answers the proxy's 407 challenge with ``user`` and ``token``,
    as a person would in the browser's login dialog (Chromium takes no login in
    ``--proxy-server``)."""
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(LOGIN_EXTENSION))
    login = json.dumps({"username": user, "password": token})
    (folder / "login.js").write_text(LOGIN_SCRIPT % login)
    return folder


async def _chromium_step(site: EgressSite, port: int) -> None:
    """Headless Chromium with the gateway as its one proxy, logging in through an extension
    (``login_extension``). Loopback goes through the proxy too (``<-loopback>``), and the
    site's certificate is trusted by its key alone."""
    for program in (CHROMIUM, DRIVER):
        assert shutil.which(program), f"{program} is missing: sh deploy/host-packages.sh test"
    extension = login_extension(
        site.ca_file.parent / "login-extension", "crawler-a-country-de", TOKENS["crawler-a"]
    )

    def browse() -> list[str]:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--proxy-server=http://127.0.0.1:{port}",
            "--proxy-bypass-list=<-loopback>",
            f"--ignore-certificate-errors-spki-list={site.spki}",
            f"--load-extension={extension}",
            # Chromium loads an unpacked extension from the command line only when told to.
            "--disable-features=DisableLoadExtensionCommandLineSwitch",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
        try:
            driver.set_page_load_timeout(30)
            return [page(driver, site.url("/chromium", tls=tls)) for tls in (False, True)]
        finally:
            driver.quit()

    def page(driver: webdriver.Chrome, url: str) -> str:
        """The page's text once the site answered: until the extension's worker has started,
        the browser shows the gateway's 407 (the site sees nothing of it)."""
        deadline = time.monotonic() + 20
        while True:
            driver.get(url)
            text = str(driver.execute_script("return document.body.innerText"))
            if "seen from" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    texts = await asyncio.to_thread(browse)
    visits = site.seen("/chromium")
    assert sorted(v.scheme for v in visits) == ["http", "https"], visits
    assert all(v.address in EXITS.values() and "Chrome" in v.agent for v in visits), visits
    for text, visit in zip(texts, sorted(visits, key=lambda v: v.scheme), strict=True):
        assert text.strip() == f"{visit.scheme} /chromium seen from {visit.address}"


async def _sticky_session(site: EgressSite, port: int) -> None:
    """A session leaves from one address for as long as it is used; requests without one, at
    the same time, leave through the client's other leases, from the other addresses."""
    async with (
        httpx.AsyncClient(
            proxy=proxy_url(port, "crawler-b-session-s1", client="crawler-b"), trust_env=False
        ) as sticky,
        httpx.AsyncClient(
            proxy=proxy_url(port, "crawler-b", client="crawler-b"), trust_env=False
        ) as rotating,
    ):
        for n in range(6):
            assert (await sticky.get(site.url(f"/sticky/{n}"), timeout=20)).status_code == 200
        for n in range(6):
            assert (await rotating.get(site.url(f"/rotating/{n}"), timeout=20)).status_code == 200
        for n in range(6, 9):
            assert (await sticky.get(site.url(f"/sticky/{n}"), timeout=20)).status_code == 200
    session = {v.address for v in site.visits if v.path.startswith("/sticky/")}
    assert len(session) == 1, site.visits
    rotated = {v.address for v in site.visits if v.path.startswith("/rotating/")}
    assert len(rotated) == 2, site.visits
    assert not session & rotated


async def _blocked_target_moves_on(site: EgressSite, port: int) -> None:
    """The site bans the first address that asks for ``/blocked``: the gateway reports the
    block, retries through another proxy, and the crawler gets the page; the proxy that was
    blocked carries no later request to that host."""
    async with httpx.AsyncClient(proxy=proxy_url(port, "crawler-a"), trust_env=False) as http:
        for _ in range(4):
            answer = await http.get(site.url(BLOCKED), timeout=20)
            assert answer.status_code == 200, answer.text
    visits = site.seen(BLOCKED)
    assert [v.status for v in visits] == [403, 200, 200, 200, 200], visits
    assert site.banned in EXITS.values()
    assert all(v.address != site.banned for v in visits[1:]), visits
