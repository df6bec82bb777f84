"""The lease helper on whatever a client can make Squid hand it
(docs/decisions/0092-nobody-who-reaches-a-proxy.md): every request line gets exactly one well-formed
answer on its own channel, nothing raises, and what is logged names no secret. Run in-process on
byte streams; the helper as Squid runs it is tested in tests/integration/test_lease_helper.py and
tests/reliability/test_helper_flood.py."""

from __future__ import annotations

import io
import re
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, quote_from_bytes

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.providers.squidauth import helper
from services.providers.squidauth.pure import scheme
from tests.unit.test_lease_credentials import MASTER, UID

KEY = scheme.proxy_key(MASTER, UID)
WELL_FORMED = re.compile(
    rb'^(?:(\S+) )?(OK(?: lease=[A-Za-z0-9._:-]{1,128})?|ERR|BH)(?: message="[^"\r\n]*")?$'
)
ANY_BYTES = st.binary(max_size=300)


def valid_password(token: int = 7) -> tuple[str, str]:
    expires = time.time_ns() // 10**6 + 3_600_000
    return scheme.lease_credential(KEY, "lease-1", token, expires)


def fence_in(directory: str, floor: int = 0) -> helper.Fence:
    return helper.Fence(str(Path(directory) / "fence"), floor)


def ask(line: bytes, fence: helper.Fence, log: list[str] | None = None) -> str:
    logged = log if log is not None else []
    return helper.answer(KEY, fence, line, concurrent=True, log=logged.append)


def request(channel: bytes, user: bytes, password: bytes) -> bytes:
    """A line as Squid writes it: the fields URL-encoded."""
    return b"%b %b %b" % (
        channel,
        quote_from_bytes(user).encode(),
        quote_from_bytes(password).encode(),
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channel=st.integers(0, 10**6), user=ANY_BYTES, password=ANY_BYTES)
def test_any_user_and_password_are_refused_on_their_channel(
    tmp_path: Path, channel: int, user: bytes, password: bytes
) -> None:
    fence = fence_in(str(tmp_path))
    reply = ask(request(str(channel).encode(), user, password), fence)
    match = WELL_FORMED.match(reply.encode("latin-1"))
    assert match is not None, reply
    assert match.group(1) == str(channel).encode()
    assert match.group(2) == b"ERR"


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.binary(max_size=400))
def test_any_line_gets_one_answer_and_never_raises(tmp_path: Path, line: bytes) -> None:
    line = line.replace(b"\n", b"")
    reply = ask(line, fence_in(str(tmp_path)))
    match = WELL_FORMED.match(reply.encode("latin-1"))
    assert match is not None, reply
    words = line.split()
    assert match.group(1) == (words[0] if words else None)


LIMIT = 64
"""The line bound of the loop test: small, so that long lines are common."""


def _line() -> st.SearchStrategy[bytes]:
    user, password = valid_password()
    good = st.integers(0, 999).map(
        lambda n: b"%d %b %b" % (n, quote(user).encode(), quote(password).encode())
    )
    junk = st.binary(max_size=3 * LIMIT).map(lambda b: b.replace(b"\n", b""))
    numbered = st.tuples(st.integers(0, 999), junk).map(lambda p: b"%d %b" % p)
    return st.one_of(good, junk, numbered)


@settings(max_examples=200)
@given(lines=st.lists(_line(), max_size=12), ending=st.booleans())
def test_the_loop_answers_every_line_once_in_order_on_its_channel(
    lines: list[bytes], ending: bool
) -> None:
    data = b"\n".join(lines) + (b"\n" if ending else b"")
    out = io.BytesIO()
    with tempfile.TemporaryDirectory() as directory:
        helper.serve(
            io.BytesIO(data),
            out,
            KEY,
            fence_in(directory),
            concurrent=True,
            limit=LIMIT,
            log=lambda _: None,
        )
    expected: list[tuple[bytes | None, bytes | None, bool]] = []
    for line in lines:
        if len(line) > LIMIT:
            words = line[:LIMIT].split()
            expected.append((words[0] if words else None, b"ERR", True))
        elif line.strip():
            expected.append((line.split()[0], None, False))
    answers = out.getvalue().split(b"\n")
    assert answers[-1] == b""
    assert len(answers) - 1 == len(expected)
    for reply, (channel, verdict, too_long) in zip(answers, expected, strict=False):
        match = WELL_FORMED.match(reply)
        assert match is not None, reply
        assert match.group(1) == channel
        if verdict is not None:
            assert match.group(2) == verdict
        if too_long:
            assert b"too long" in reply


@pytest.mark.parametrize(
    ("user", "password", "reason"),
    [
        pytest.param(
            b"lease-1.7.9999999999999." + "é".encode() * 32, b"x", "malformed", id="non-ascii-mac"
        ),
        pytest.param("lease-1.².1111111111111." + "a" * 32, "x", "malformed", id="superscript"),
        pytest.param("é".encode(), "é".encode(), "malformed", id="e-acute"),
        pytest.param(b"\xff\xfe\x80", b"\xc0\xaf", "malformed", id="not-utf8"),
        pytest.param(b"x" * 8192, b"y" * 8192, "malformed", id="8KiB"),
        pytest.param("lease-1.٣.1111111111111." + "a" * 32, "x", "malformed", id="arabic-3"),
        pytest.param(b"lease-1.1." + b"9" * 40 + b"." + b"a" * 32, b"x", "not valid", id="big"),
        pytest.param(b"lease-1", b"7.9999999999999." + b"a" * 32, "malformed", id="old-form"),
        pytest.param(b"egress-probe", b"9999999999999." + b"a" * 32, "malformed", id="old-probe"),
        pytest.param(b"lease|1.7.9999999999999." + b"a" * 32, b"x", "malformed", id="pipe"),
        pytest.param(b"lease-1", b"", "expected", id="no-password"),
    ],
)
def test_malformed_credentials_are_refused_with_a_reason(
    tmp_path: Path, user: bytes | str, password: bytes | str, reason: str
) -> None:
    user_b = user.encode() if isinstance(user, str) else user
    password_b = password.encode() if isinstance(password, str) else password
    log: list[str] = []
    reply = ask(request(b"5", user_b, password_b).rstrip(), fence_in(str(tmp_path)), log)
    assert reply.startswith("5 ERR message="), reply
    assert reason in reply
    assert len(log) == 1
    assert "\n" not in log[0]


def test_a_refusal_is_logged_with_the_lease_id_and_token_never_a_mac(tmp_path: Path) -> None:
    user, password = valid_password()
    name_mac = user.rpartition(".")[2]
    token, expires, mac = password.split(".")
    log: list[str] = []
    for forged_user, forged_password in (
        (user, f"{token}.{int(expires) + 1}.{mac}"),  # the right user name, a wrong password
        (user[:-1] + ("0" if user[-1] != "0" else "1"), password),  # a wrong user name
    ):
        line = f"3 {forged_user} {forged_password}".encode()
        assert ask(line, fence_in(str(tmp_path)), log) == (
            '3 ERR message="credential not valid for this proxy"'
        )
    assert len(log) == 2
    for logged in log:
        assert "lease='lease-1' token=7" in logged
        assert mac not in logged
        assert name_mac[:8] not in logged
        assert expires[:8] not in logged


def test_a_probe_refusal_is_logged_by_its_fixed_name_only(tmp_path: Path) -> None:
    user, _ = scheme.probe_credential(KEY, time.time_ns() // 10**6 + 60_000)
    log: list[str] = []
    assert ask(f"4 {user} x".encode(), fence_in(str(tmp_path)), log).startswith("4 ERR")
    assert log == ["refused user='egress-probe': message=\"credential not valid for this proxy\""]


def test_the_current_lease_still_passes_and_is_fenced_below_the_floor(tmp_path: Path) -> None:
    user, password = valid_password(token=7)
    line = f"1 {user} {password}".encode()
    assert ask(line, fence_in(str(tmp_path), floor=7)) == "1 OK lease=lease-1"
    assert ask(line, fence_in(str(tmp_path), floor=8)) == (
        '1 ERR message="fenced: a newer lease is in use"'
    )


def test_the_floor_is_a_start_a_higher_recorded_token_stays(tmp_path: Path) -> None:
    fence = fence_in(str(tmp_path), floor=20)
    assert not fence.admit(19)
    assert fence.admit(20)
    assert fence.admit(25)
    assert (tmp_path / "fence").read_text() == "25\n"
    assert not fence_in(str(tmp_path), floor=20).admit(24)


def test_numbers_are_ascii_digits_only() -> None:
    assert helper._number("0042") == 42
    for text in ("²", "٣", "1²", "", "-1", "+1", " 1", "1" * 20, "1_0"):
        assert helper._number(text) is None, text


def test_a_flood_of_refusals_logs_a_bounded_number_of_lines() -> None:
    lines: list[str] = []
    log = helper.Log(lines.append)
    for _ in range(10 * helper.LOG_BURST):
        log("refused")
    assert len(lines) == helper.LOG_BURST


def test_an_unexpected_error_on_one_line_is_answered_bh_and_the_loop_goes_on(
    tmp_path: Path,
) -> None:
    class Broken(helper.Fence):
        def admit(self, token: int) -> bool:
            raise RuntimeError("a bug")

    user, password = valid_password()
    data = f"1 {user} {password}\n2 {user} {password}\n".encode()
    out = io.BytesIO()
    log: list[str] = []
    helper.serve(
        io.BytesIO(data), out, KEY, Broken(str(tmp_path / "f")), concurrent=True, log=log.append
    )
    first, second, end = out.getvalue().split(b"\n")
    assert first.startswith(b"1 BH ")
    assert second.startswith(b"2 BH ")
    assert end == b""
    assert "RuntimeError" in log[0]
    assert password not in log[0]


def test_helpers_that_keep_the_fencing_file_open_agree_through_it(tmp_path: Path) -> None:
    first = helper.Fence(str(tmp_path / "fence"), keep_open=True)
    second = helper.Fence(str(tmp_path / "fence"), keep_open=True)
    assert first.admit(10)
    assert second.admit(20)
    assert not first.admit(10)  # the other's token, read through the file kept open
    assert first.admit(20)
    assert (tmp_path / "fence").read_text() == "20\n"
