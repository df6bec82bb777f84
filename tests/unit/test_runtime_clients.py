"""The clients file of a running service (``services.runtime.clients``): loaded at start,
re-read when it changes, kept on a broken file with the failure counted through the service's
callback (docs/decisions/0154-the-clients-table-below-the-services.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from services.discovery.http.access import access_metrics, guard
from services.runtime.clients import Clients
from services.runtime.pure.clients import ADMIN, OPEN, hash_token
from services.runtime.settings.errors import ConfigError

TOKEN_A = "token-a" * 6
TOKEN_B = "token-b" * 6
ADMIN_TOKEN = "admin-token" * 4


def _write(path: Path, *clients: tuple[str, str, str]) -> None:
    path.write_text(
        "clients:\n"
        + "".join(
            f"  - name: {name}\n    token: {hash_token(token)}\n    scopes: {scopes}\n"
            for name, token, scopes in clients
        )
    )


@pytest.fixture
def clients_file(tmp_path: Path) -> Path:
    path = tmp_path / "clients.yaml"
    _write(path, ("crawler-a", TOKEN_A, "[lease, read]"))
    return path


def test_a_file_is_loaded_and_tokens_are_told_apart(clients_file: Path) -> None:
    clients = Clients(clients_file)
    assert not clients.open
    found = clients.identify(TOKEN_A)
    assert found is not None
    assert found.name == "crawler-a"
    assert clients.identify(TOKEN_B) is None
    assert clients.identify("") is None
    assert clients.by_name("crawler-a") == found
    assert clients.by_name("crawler-b") is None


def test_the_token_adds_an_admin_client_and_neither_means_open(clients_file: Path) -> None:
    admin = Clients(clients_file, ADMIN_TOKEN).identify(ADMIN_TOKEN)
    assert admin is not None
    assert admin.may(ADMIN)
    assert Clients(None, ADMIN_TOKEN).identify(TOKEN_A) is None
    nobody = Clients()
    assert nobody.open
    assert nobody.identify("anything") is OPEN


def test_a_changed_file_is_taken_and_who_left_is_told(clients_file: Path) -> None:
    left: list[list[str]] = []
    clients = Clients(clients_file)
    clients.on_leave(left.append)
    assert not clients.poll()  # the same bytes: nothing to do
    _write(clients_file, ("crawler-b", TOKEN_B, "[lease]"))
    assert clients.poll()
    assert clients.identify(TOKEN_A) is None
    found = clients.identify(TOKEN_B)
    assert found is not None
    assert found.name == "crawler-b"
    assert left == [["crawler-a"]]


def test_a_broken_file_keeps_the_table_and_is_counted_until_mended(clients_file: Path) -> None:
    errors: list[None] = []
    clients = Clients(clients_file, file_error=lambda: errors.append(None))
    clients_file.write_text("clients:\n  - name: crawler-a\n    token: not-a-hash\n")
    assert not clients.poll()
    assert len(errors) == 1
    assert clients.identify(TOKEN_A) is not None
    assert not clients.poll()  # still broken: reported again
    assert len(errors) == 2
    clients_file.unlink()
    assert not clients.poll()  # gone: the same
    assert len(errors) == 3
    assert clients.identify(TOKEN_A) is not None
    _write(clients_file, ("crawler-b", TOKEN_B, "[read]"))
    assert clients.poll()
    assert clients.identify(TOKEN_B) is not None
    assert clients.identify(TOKEN_A) is None
    assert len(errors) == 3


def test_a_file_that_cannot_be_used_at_start_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--clients-file: .*missing\.yaml"):
        Clients(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("clients: 3\n")
    with pytest.raises(ConfigError, match=r"^--clients-file: "):
        Clients(broken)


def test_the_discovery_guard_counts_a_broken_file_in_its_metric(clients_file: Path) -> None:
    registry = CollectorRegistry()
    clients = Clients(clients_file)
    guard(clients, access_metrics(registry))
    clients_file.write_text("not: a clients file\n")
    clients.poll()
    clients.poll()
    assert registry.get_sample_value("egress_api_clients_file_errors_total") == 2
