"""The hetzner provider's API token: read from ``HCLOUD_TOKEN`` or ``tokenFile``, sent to the fake
(which answers nothing without it), and found in no log record, exception text or repr, whether
calls succeed, fail, or the token is refused; a rotated token file is read again."""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from services.providers.base import Leftover, Permanent, ProviderError
from services.providers.hetzner.provider import HetznerProvider
from services.testing.hetzner import HetznerFake
from tests.contract.provider import (
    closing,
    delete_all,
)
from tests.support.hetzner_support import ENTRY, TOKEN, config, fake, request

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture

WRONG = "hzWRONGtoken99887766554433221100ffeeddccbbaa0099887766554433221100"


def texts_of(exc: BaseException) -> list[str]:
    """Everything an exception shows: its text, repr, cause and the formatted traceback."""
    shown = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    if exc.__cause__ is not None:
        shown += [str(exc.__cause__), repr(exc.__cause__)]
    return shown


async def failing(call: Callable[[], Awaitable[Any]]) -> list[str]:
    with pytest.raises(ProviderError) as caught:
        await call()
    return texts_of(caught.value)


async def test_the_token_is_in_no_log_record_error_or_repr(
    fake: HetznerFake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # urllib3 and anything else on stdlib logging
    provider = HetznerProvider(ENTRY, config(fake))
    shown: list[str] = [repr(provider), repr(provider.config), str(provider.config)]
    with structlog.testing.capture_logs() as records:
        pid = await provider.create(request("px-1", cloud_init="#cloud-config\n"))
        await provider.get(pid)
        await provider.get(pid)
        await provider.list_by_tag()
        fake.inject(429, "rate_limit_exceeded", kind="server_get")
        shown += await failing(lambda: provider.get(pid))
        fake.inject(500, "server_error", kind="server_list")
        shown += await failing(provider.list_by_tag)
        fake.inject(400, "invalid_input", kind="server_create", details={"fields": []})
        shown += await failing(lambda: provider.create(request("px-2")))
        shown += await failing(lambda: provider.create(request("px-Bad_")))
        await delete_all(provider)
        await provider.leftovers()
        await provider.close()

        monkeypatch.setenv("HCLOUD_TOKEN", WRONG)
        refused = HetznerProvider(ENTRY, config(fake))
        shown.append(repr(refused))
        shown += await failing(lambda: refused.get(pid))
        shown += await failing(refused.list_by_tag)
        shown += await failing(refused.leftovers)
        leftover = Leftover("firewalls/1", "firewall:hz-eu", datetime.now(UTC), "firewall")
        shown += await failing(lambda: refused.delete_leftover(leftover))
        await refused.close()
    assert any("unauthorized" in text for text in shown)
    assert fake.calls("server_create") >= 1  # the right token did reach the fake
    logged = caplog.text + "\n".join(str(record) for record in records)
    assert "server create accepted" in logged
    for secret in (TOKEN, WRONG):
        assert secret not in logged
        for text in shown:
            assert secret not in text, text


async def test_an_answer_echoing_the_token_is_scrubbed_in_our_error_and_the_chained_one(
    fake: HetznerFake,
) -> None:
    async with closing(HetznerProvider(ENTRY, config(fake))) as provider:
        fake.inject(500, "server_error", kind="server_get", message=f"bad header Bearer {TOKEN}")
        shown = await failing(lambda: provider.get("40000001"))
        fake.inject(
            400,
            "invalid_input",
            kind="server_list",
            message="refused",
            details={"fields": [{"name": "token", "messages": [TOKEN]}]},
        )
        shown += await failing(provider.list_by_tag)
    assert "bad header Bearer <redacted>" in shown[0]
    for text in shown:
        assert TOKEN not in text, text


async def test_without_a_token_no_call_is_made_and_the_error_says_where_to_put_one(
    fake: HetznerFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN")
    async with closing(HetznerProvider(ENTRY, config(fake))) as provider:
        with pytest.raises(Permanent, match=r"set HCLOUD_TOKEN .* or tokenFile"):
            await provider.create(request("px-1"))
    assert fake.requests == []


@pytest.mark.parametrize("bad", ["two words-for-a-token", "tab\there", "ünïcode-token", " "])
async def test_a_token_no_api_gives_is_refused_without_being_shown(
    fake: HetznerFake, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("HCLOUD_TOKEN", bad)
    async with closing(HetznerProvider(ENTRY, config(fake))) as provider:
        with pytest.raises(Permanent) as caught:
            await provider.list_by_tag()
    assert "HCLOUD_TOKEN" in str(caught.value)
    if bad.strip():
        assert all(bad not in text for text in texts_of(caught.value))
    assert fake.requests == []


async def test_a_token_file_wins_and_is_read_again_after_the_token_was_refused(
    fake: HetznerFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HCLOUD_TOKEN", WRONG)  # ignored: the config names a file
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # as `kubectl create secret --from-file` leaves it
    async with closing(
        HetznerProvider(ENTRY, config(fake, token_file=str(token_file)))
    ) as provider:
        await provider.list_by_tag()
        fake.token = "hzROTATEDtoken00112233445566778899aabbccddeeff00112233445566778899"
        with pytest.raises(Permanent, match="unauthorized"):
            await provider.list_by_tag()
        token_file.write_text(fake.token)  # the Secret is updated
        assert await provider.list_by_tag() == []


async def test_an_unreadable_token_file_is_permanent_naming_the_file(
    fake: HetznerFake, tmp_path: Path
) -> None:
    missing = tmp_path / "absent"
    big = tmp_path / "big"
    big.write_bytes(b"x" * 10_000)
    for path, problem in (
        (missing, "cannot read it"),
        (tmp_path, "cannot read it"),
        (big, "larger"),
    ):
        async with closing(HetznerProvider(ENTRY, config(fake, token_file=str(path)))) as provider:
            with pytest.raises(Permanent, match=re.escape(f"tokenFile {path}: {problem}")):
                await provider.get("40000001")
    assert fake.requests == []
