"""The digitalocean provider's API token against the local fake: from a file (a mounted Secret)
read at the first call and again after a 401, and never in a log line or an error, even when an
answer echoes it."""

from __future__ import annotations

import io
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import structlog

from services.providers.base import Permanent, ProviderError
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.runtime.observability.logs import configure_logging
from services.testing.digitalocean import DigitalOceanFake
from tests.contract.provider import closing
from tests.support.digitalocean_support import ENTRY, config, fake, provider, request, running

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # fixtures

Call = Callable[[], Awaitable[object]]


async def test_a_token_file_is_read_at_the_first_call_and_again_after_a_401(
    fake: DigitalOceanFake, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("dop_v1_old\n")
    async with closing(
        DigitalOceanProvider(ENTRY, config(fake, token_file=str(token_file)))
    ) as made:
        with pytest.raises(Permanent, match="HTTP 401") as caught:
            await made.list_by_tag()
        assert "dop_v1_old" not in str(caught.value)
        token_file.write_text(fake.token + "\n")  # the Secret rotated
        assert await made.list_by_tag() == []
        token_file.unlink()
        assert await made.list_by_tag() == []  # read once: no need to read it again
    async with closing(
        DigitalOceanProvider(ENTRY, config(fake, token_file=str(token_file)))
    ) as missing:
        with pytest.raises(Permanent, match=f"tokenFile {token_file}: cannot read it"):
            await missing.list_by_tag()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """Every log line at debug, as the product renders it, and the raw records too."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = structlog.get_config()
    stream = io.StringIO()
    configure_logging("debug", "json", stream)
    root.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    try:
        yield stream
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**saved)


async def test_the_token_is_never_logged_nor_in_an_error(
    fake: DigitalOceanFake, logs: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    made = provider(fake)
    wrong_token = "dop_v1_wrong_token_0123456789abcdef"
    wrong = provider(fake, token=wrong_token)
    errors: list[BaseException] = []

    async def failing(call: Call) -> None:
        try:
            await call()
        except ProviderError as exc:
            errors.append(exc)
            errors.append(exc.__cause__ or exc)

    try:
        pid = await made.create(request("px-t"))
        await running(made, pid)
        await made.list_by_tag()
        await made.leftovers()
        for status, error_id in [(429, "too_many_requests"), (500, "server_error"), (422, "x")]:
            fake.inject("droplets.get", status, error_id, f"echo: Bearer {fake.token}")
            await failing(lambda: made.get(pid))
        await failing(lambda: wrong.get(pid))
        await failing(lambda: wrong.create(request("px-u")))
        await made.delete(pid)
    finally:
        await made.close()
        await wrong.close()
    assert len(errors) == 10
    texts = [str(e) for e in errors] + [repr(e) for e in errors]
    texts += [logs.getvalue(), caplog.text, repr(made), repr(vars(made.api))]
    for secret in (fake.token, wrong_token):
        assert [t for t in texts if secret in t] == []
    assert "<redacted>" in str(errors[0])  # an answer echoing the token is scrubbed
    assert "firewall made" in logs.getvalue()  # the logs were captured at all
