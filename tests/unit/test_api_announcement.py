"""The discovery API's address as `up` announces it in the data dir, and when a command does
not believe it (docs/decisions/0147-the-cli-as-one-language.md): the command sends its token
to the URL it names."""

from __future__ import annotations

import json
from pathlib import Path

from services.cli.lease.apiaddress import API_FILE, announce, announced, api_url_for, withdraw


def test_an_announcement_is_read_back_and_withdrawn(tmp_path: Path) -> None:
    path = announce(tmp_path, "http://127.0.0.1:18080")
    assert path.stat().st_mode & 0o777 == 0o600
    assert announced(tmp_path) == "http://127.0.0.1:18080"
    withdraw(path)
    assert not path.exists()
    assert announced(tmp_path) is None


def test_an_announcement_others_may_write_is_not_believed(tmp_path: Path) -> None:
    path = announce(tmp_path, "http://127.0.0.1:18080")
    path.chmod(0o666)
    assert announced(tmp_path) is None


def test_an_announcement_of_a_process_gone_is_not_believed(tmp_path: Path) -> None:
    (tmp_path / API_FILE).write_text(json.dumps({"url": "http://127.0.0.1:1", "pid": 2**22 + 1}))
    (tmp_path / API_FILE).chmod(0o600)
    assert announced(tmp_path) is None


def test_a_wildcard_listener_is_reached_on_loopback() -> None:
    assert api_url_for("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert api_url_for("::1", 8080) == "http://[::1]:8080"
    assert api_url_for("10.0.0.5", 9000) == "http://10.0.0.5:9000"
