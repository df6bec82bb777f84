"""One version number everywhere a user reads one (D100): pyproject.toml's, shown by `--version`,
the OpenAPI document and `up`'s banner, and carried by the client library too. A release that
bumps one place and forgets another fails here, not in a user's bug report."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from services.cli.main import main
from services.cli.run.up_cmd import _print_banner
from services.discovery.http.app import DiscoveryApi, create_app
from services.discovery.leasing.leases import Leases
from services.discovery.observability.metrics import DiscoveryMetrics
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.runtime.eventlog.memory import InMemoryEventStore
from services.runtime.observability.metrics import Metrics
from services.runtime.service import Started
from services.runtime.version import VERSION

ROOT = Path(__file__).resolve().parents[2]
# PEP 440's public versions, as a release would carry them (no local "+..." part).
RELEASE = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")


def declared(pyproject: Path) -> str:
    project = tomllib.loads(pyproject.read_text())["project"]
    assert "version" in project, f"{pyproject}: [project] version must be written out"
    return str(project["version"])


def test_the_number_is_pyprojects_and_the_installed_one() -> None:
    # A stale editable install (pyproject bumped, never reinstalled) shows here too.
    assert declared(ROOT / "pyproject.toml") == VERSION
    assert RELEASE.fullmatch(VERSION), f"{VERSION!r} is not a release version (PEP 440)"


def test_the_client_library_carries_the_same_number() -> None:
    assert declared(ROOT / "clients" / "python" / "pyproject.toml") == VERSION
    assert version("egress-proxies-client") == VERSION
    # Its README names the wheel a build makes; a stale name would send users to a missing file.
    readme = (ROOT / "clients" / "python" / "README.md").read_text()
    assert f"egress_proxies_client-{VERSION}-py3-none-any.whl" in readme


def test_version_option_shows_it() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"egress-proxies, version {VERSION}\n"


def test_the_openapi_document_is_the_releases() -> None:
    # The app is built, not served: its document is generated from the routes alone.
    store = InMemoryEventStore()
    views = Views(None, store)  # type: ignore[arg-type]  # no JetStream: nothing is read
    metrics = Metrics()
    leases = Leases(store, views, LeasePolicy(), DiscoveryMetrics(metrics.registry))
    app = create_app(DiscoveryApi(leases, views, metrics))
    document = app.openapi_schema.to_schema()
    assert document["info"]["version"] == VERSION
    # The API's own version is its path prefix, unchanged by a release.
    lease_routes = [path for path in document["paths"] if "lease" in path]
    assert lease_routes, "the document lists no lease route"
    assert all(path.startswith("/v1/") for path in lease_routes), lease_routes


def test_the_banner_shows_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    started = Started(nats_url="nats://127.0.0.1:4222", metrics_url="", services=("discovery",))
    values: dict[str, object] = {
        "api_port": 8080,
        "providers_config": None,
        "probe_target": None,
        "local_providers": [],
        "check_url": None,
        "gateway_host": "0.0.0.0",
        "gateway_port": 8001,
    }
    _print_banner(started, None, tmp_path, values)
    lines = capsys.readouterr().out.splitlines()
    assert f"egress-proxies {VERSION} up" in lines[0]
    # Where a crawler on this machine reaches the gateway, like the discovery API's line.
    assert any(re.search(r"gateway +http://127\.0\.0\.1:8001 ", line) for line in lines)
