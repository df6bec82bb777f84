"""The console in a real browser against the real system: `up` with Squid, headless Chromium.

Chromium and its driver come from the distribution's packages (deploy/host-packages.sh test);
Selenium is pointed at them, so nothing is downloaded when the test runs. With
``EGRESS_SCREENSHOTS`` set to a directory, the test saves the pages' screenshots there (that is
how docs/console-fleet.png and docs/console-proxy.png are made).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.wait import WebDriverWait

from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = pytest.mark.e2e

TOKEN = "browser-test-token"
CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
MANIFESTS = """apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: de-1, namespace: crawl}
spec:
  provider: local
  attributes: {country: de, tier: gold}
---
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: fr-1, namespace: crawl}
spec:
  provider: local
  attributes: {country: fr}
"""
RECORD_HEALTH = """
window.__notReloaded = true;
window.__seen = [];
const fleet = document.getElementById("fleet");
const note = () => {
  const cell = fleet.querySelector('tr[data-uid="' + arguments[0] + '"] td[data-col="health"]');
  window.__seen.push(cell ? cell.textContent.trim() : "");
};
new MutationObserver(note).observe(fleet, {childList: true, subtree: true});
"""


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    for program in (CHROMIUM, DRIVER):
        assert shutil.which(program), f"{program} is missing: sh deploy/host-packages.sh test"
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1440,900"):
        options.add_argument(flag)
    options.add_argument("--disable-dev-shm-usage")
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _with_token(up: Up, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        up.api + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        got: dict[str, Any] = json.loads(response.read())
    return got


def _cell(driver: WebDriver, uid: str, column: str) -> str:
    """A cell's text, read in one script: the live table may be swapped in between two
    WebDriver calls, which would leave a found element stale."""
    text = driver.execute_script(
        "const c = document.querySelector(arguments[0]); return c ? c.textContent.trim() : '';",
        f'tr[data-uid="{uid}"] td[data-col="{column}"]',
    )
    return str(text)


def _health(driver: WebDriver, uid: str) -> str:
    return _cell(driver, uid, "health")


def _wait(driver: WebDriver, condition: Any, timeout: float = 60) -> None:
    WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)


def _shot(driver: WebDriver, name: str, tmp_path: Path) -> None:
    driver.save_screenshot(str(tmp_path / name))
    wanted = os.environ.get("EGRESS_SCREENSHOTS")
    if wanted:
        shutil.copy(tmp_path / name, Path(wanted) / name)


async def test_console_in_a_browser(tmp_path: Path, browser: WebDriver) -> None:
    manifest = tmp_path / "proxies.yaml"
    manifest.write_text(MANIFESTS)
    run = asyncio.to_thread
    with hello_target() as target:
        async with running_up(
            tmp_path,
            "--observe-interval",
            "30",  # the killed Squid stays unhealthy for a while before it is replaced
            health_check_url=target,
            up_env={"DISCOVERY_TOKEN": TOKEN},
        ) as up:
            applied = await up.cli("apply", "-f", str(manifest), "--wait")
            assert applied.returncode == 0, applied.stdout + applied.stderr

            async def both_healthy() -> bool:
                return [p["healthy"] for p in await up.proxies()] == [True, True]

            await until(both_healthy, timeout=60, every=0.5, what="both proxies healthy")
            proxies = {p["name"]: p for p in await up.proxies()}
            de, fr = proxies["de-1"], proxies["fr-1"]
            lease = {"selector": {"country": "fr"}, "ttlSeconds": 600, "holder": "crawler-7"}
            await run(_with_token, up, "POST", "/v1/leases", lease)

            # A login is required: the form, then the fleet; the cookie is HttpOnly and Strict.
            await run(browser.get, up.api + "/ui")
            assert "/ui/login" in browser.current_url
            await run(browser.find_element(By.NAME, "token").send_keys, TOKEN)
            await run(browser.find_element(By.CSS_SELECTOR, "form.login button").click)
            await run(_wait, browser, lambda d: _health(d, de["uid"]).startswith("healthy"))
            (cookie,) = [c for c in browser.get_cookies() if c["name"] == "egress_console"]
            assert cookie["httpOnly"] is True
            assert cookie["sameSite"] == "Strict"
            assert TOKEN not in browser.current_url
            listed = browser.execute_script(
                "return Array.from(document.querySelectorAll('table.fleet tbody tr'),"
                " r => r.getAttribute('data-uid'));"
            )
            assert listed == [de["uid"], fr["uid"]]
            assert "crawler-7" in _cell(browser, fr["uid"], "lease")

            healthy_then = datetime.now(UTC)
            # Kept as a sleep: the time control has whole seconds, so the kill below must come
            # a whole second after the instant recorded here; the clock is the condition.
            await asyncio.sleep(1.1)
            browser.execute_script(RECORD_HEALTH, de["uid"])

            # A killed Squid turns its row unhealthy, without a reload.
            os.kill(up.squid_pid(de["providerID"]), signal.SIGKILL)
            await run(_wait, browser, lambda d: _health(d, de["uid"]).startswith("unhealthy"))
            assert browser.execute_script("return window.__notReloaded === true")
            seen = browser.execute_script("return window.__seen")
            assert any(text.startswith("unhealthy") for text in seen), seen
            _shot(browser, "console-fleet.png", tmp_path)

            # The proxy page: its timeline, from the declaration to the failed probes.
            await run(browser.find_element(By.LINK_TEXT, "de-1").click)
            await run(_wait, browser, lambda d: "/ui/proxies/" in d.current_url)
            types, summaries = browser.execute_script(
                "const rows = document.querySelectorAll('table.timeline tbody tr');"
                "return [Array.from(rows, r => r.getAttribute('data-type')),"
                " Array.from(rows, r => r.querySelector('.summary').textContent)];"
            )
            for expected in ("ProxyDeclared", "CreateInstance", "PhaseChanged", "HealthChanged"):
                assert expected in types, types
            assert any(text.startswith("unhealthy") for text in summaries), summaries
            # Its traffic panel: discovery's NATS user reads the TRAFFIC stream `up` made.
            assert browser.find_elements(By.ID, "traffic-refused") == []
            assert "No traffic recorded" in browser.find_element(By.ID, "no-traffic").text
            browser.set_window_size(1440, 1400)  # the whole timeline in the screenshot
            _shot(browser, "console-proxy.png", tmp_path)
            browser.set_window_size(1440, 900)

            # The time control: the fleet as it was before the kill.
            await run(browser.get, up.api + "/ui")
            picker = browser.find_element(By.CSS_SELECTOR, 'form.when input[name="at"]')
            value = healthy_then.strftime("%Y-%m-%dT%H:%M:%S")
            browser.execute_script("arguments[0].value = arguments[1]", picker, value)
            await run(browser.find_element(By.CSS_SELECTOR, "form.when button").click)
            await run(_wait, browser, lambda d: "at=" in d.current_url)
            assert "As of" in browser.find_element(By.ID, "state").text
            assert _health(browser, de["uid"]).startswith("healthy")
            assert browser.find_elements(By.CSS_SELECTOR, "[data-live]") == []

            # Logging out ends the session.
            await run(browser.find_element(By.CSS_SELECTOR, "form.logout button").click)
            await run(browser.get, up.api + "/ui")
            assert "/ui/login" in browser.current_url
