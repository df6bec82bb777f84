"""Shared pieces of the hetzner provider tests: the token the fake expects, a config pointing at a
fake, requests with the fields the tests vary, and the fake as a fixture."""

from __future__ import annotations

import email.parser
import email.policy
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest

from services.providers.base import CreateRequest
from services.providers.hetzner.config import HetznerConfig
from services.testing.hetzner import HetznerFake
from tests.support.cloud_requests import cloud_request
from tests.support.markers import starts

TOKEN = "hzTESTtoken0f1e2d3c4b5a69788796a5b4c3d2e1f0aabbccddeeff0011223344"
"""Shaped like a Hetzner API token (64 letters and digits), so a leak would look like one."""
CLIENTS = ("203.0.113.0/24", "2001:db8::/32")
ENTRY = "hz-eu"


def config(fake: HetznerFake, **overrides: Any) -> HetznerConfig:
    settings: dict[str, Any] = {"allowed_clients": CLIENTS, "endpoint_url": fake.url}
    settings.update(overrides)
    return HetznerConfig(**settings)


def request(name: str, **fields: Any) -> CreateRequest:
    return cloud_request(ENTRY, name, **fields)


def user_data_parts(user_data: str) -> dict[str, str]:
    """The parts of multipart user data by file name, decoded, in order."""
    message = email.parser.Parser(policy=email.policy.default).parsestr(user_data)
    assert message.is_multipart(), user_data[:200]
    found: dict[str, str] = {}
    for part in message.iter_parts():
        assert isinstance(part, EmailMessage)
        found[part.get_filename() or "?"] = str(part.get_content())
    return found


@pytest.fixture
@starts("a local HTTP fake of the Hetzner Cloud API")
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[HetznerFake]:
    """The fake, and ``HCLOUD_TOKEN`` set to the token it expects."""
    monkeypatch.setenv("HCLOUD_TOKEN", TOKEN)
    with HetznerFake(TOKEN) as server:
        yield server
