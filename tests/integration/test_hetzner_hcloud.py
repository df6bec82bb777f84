"""The installed hcloud is one the hetzner provider is written for: the range pyproject pins is
the one ``client.py`` names, the installed version is in it, and the private attributes the
provider reaches into (hcloud has no option for them) still do what it relies on: no
client-side retry, and a response hook that sees every answer. An upgrade that moves one fails
here, not in production."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import requests
from hcloud import APIException
from packaging.requirements import Requirement
from packaging.version import Version

from services.providers.hetzner.client import (
    HCLOUD_RANGE,
    _remember,
    build_client,
    close_client,
    last_answer,
)
from services.testing.hetzner import HetznerFake
from tests.support.hetzner_support import config, fake

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def hcloud_pins() -> dict[str, str]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    found = {}
    for extra in ("hetzner", "dev"):
        (pin,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == "hcloud"]
        found[extra] = str(pin.specifier)
    return found


def test_pyproject_pins_the_range_the_client_is_written_for_and_it_is_installed() -> None:
    wanted = Requirement(f"hcloud{HCLOUD_RANGE}").specifier
    assert hcloud_pins() == {"hetzner": str(wanted), "dev": str(wanted)}
    # Per-location availability (2.18) and the attributes build_client sets (2.12).
    assert not wanted.contains(Version("2.17.1"))
    assert wanted.contains(Version(version("hcloud")))


def test_the_installed_hcloud_sends_one_request_and_runs_the_hook_on_every_client(
    fake: HetznerFake,
) -> None:
    client = build_client(config(fake))
    try:
        for base in (client._client, client._client_hetzner):
            assert base._retry_max_retries == 0
            assert isinstance(base._session, requests.Session)
            assert _remember in base._session.hooks["response"]
        # hcloud retries 502 by default, sleeping between tries: off, and the hook saw it.
        fake.inject(502, "bad_gateway", kind="server_type_list", times=3)
        with pytest.raises(APIException) as caught:
            client.server_types.get_by_name("cx23")
        assert caught.value.code == "bad_gateway"
        assert fake.calls("server_type_list") == 1
        assert last_answer.status == 502
        assert "RateLimit-Reset" in (last_answer.headers or {})
    finally:
        close_client(client)
