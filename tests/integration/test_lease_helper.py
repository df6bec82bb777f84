"""The Squid lease helper (D84) as Squid runs it: a subprocess speaking the helper protocol,
checking what discovery and the health prober mint."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest

from projections.lease import LeaseRecord
from projections.proxy import ProxyView
from services.discovery.leasing.credentials import LeaseCredentials
from services.health.credentials import ProbeCredentials
from services.providers.squidauth import helper
from services.providers.squidauth.keyed import helper_source
from services.providers.squidauth.pure import cloudinit, scheme
from tests.unit.test_lease_credentials import FUTURE, MASTER, UID, record, user_password, view

pytestmark = pytest.mark.integration

HELPER = Path(helper.__file__)


class Helper:
    """The helper as Squid runs it (``--concurrent``): one line in, one answer out."""

    def __init__(self, key_file: Path, state_file: Path) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, str(HELPER), "--key-file", str(key_file)),
                *("--state-file", str(state_file), "--concurrent"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.channel = 0

    def ask(self, user: str, password: str) -> str:
        """The answer without its channel id (checked to be the one sent), and without the
        note of an admitted lease (checked to name the lease of ``user``, D161)."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.channel += 1
        line = f"{self.channel} {quote(user, safe='')} {quote(password, safe='')}\n"
        self.process.stdin.write(line)
        self.process.stdin.flush()
        channel, _, answer = self.process.stdout.readline().rstrip("\n").partition(" ")
        assert channel == str(self.channel)
        if answer.startswith("OK "):
            assert answer == f"OK lease={user.rsplit('.', 3)[0]}", answer
            return "OK"
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=10) == 0
        self.process.stdout.close()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "lease.key"
    path.write_text(scheme.proxy_key(MASTER, UID).hex() + "\n")
    return path


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "fence"


@pytest.fixture
def checker(key_file: Path, state_file: Path) -> Iterator[Helper]:
    running = Helper(key_file, state_file)
    yield running
    running.close()


def test_the_current_lease_passes_and_a_forged_one_does_not(checker: Helper) -> None:
    lease = record(7)
    user, password = user_password(LeaseCredentials(MASTER).url(view(), lease))
    assert checker.ask(user, password) == "OK"
    token, expires, mac = password.split(".")
    for forged in (
        f"{int(token) + 1}.{expires}.{mac}",  # another token
        f"{token}.{int(expires) + 60_000}.{mac}",  # a longer lease
        f"{token}.{expires}.{'0' * len(mac)}",
        "x",
    ):
        assert checker.ask(user, forged).startswith("ERR")  # the user name alone opens nothing
    lease_id, _, name_mac = user.rpartition(".")
    other_id = str(uuid.uuid4())
    assert checker.ask(user.replace(lease.lease_id, other_id), password).startswith("ERR")
    assert checker.ask(f"{lease_id}.{'0' * len(name_mac)}", password).startswith("ERR")
    assert checker.ask(lease.lease_id, password).startswith("ERR")  # the lease id is no user


def test_an_expired_lease_is_refused(checker: Helper) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    user, password = user_password(LeaseCredentials(MASTER).url(view(), record(7, past)))
    assert checker.ask(user, password) == 'ERR message="lease expired"'


def test_credentials_of_another_proxy_are_refused(checker: Helper) -> None:
    other = ProxyView(uid="another-proxy", url="http://192.0.2.8:3128")
    lease = LeaseRecord(
        lease_id="l",
        proxy_uid="another-proxy",
        acquired_at=datetime.now(UTC),
        expires_at=FUTURE,
        ttl_seconds=60,
        fencing_token=1,
    )
    assert checker.ask(*user_password(LeaseCredentials(MASTER).url(other, lease))).startswith("ERR")


def test_a_lower_token_is_refused_once_a_higher_one_passed_even_after_a_restart(
    checker: Helper, key_file: Path, state_file: Path
) -> None:
    credentials = LeaseCredentials(MASTER)
    old = user_password(credentials.url(view(), record(10)))
    new = user_password(credentials.url(view(), record(20)))
    assert checker.ask(*old) == "OK"
    assert checker.ask(*old) == "OK"
    assert checker.ask(*new) == "OK"
    assert checker.ask(*old) == 'ERR message="fenced: a newer lease is in use"'
    assert checker.ask(*new) == "OK"
    assert state_file.read_text().strip() == "20"
    # A second helper (Squid runs several) and a restarted one agree through the state file.
    second = Helper(key_file, state_file)
    try:
        assert second.ask(*old).startswith("ERR")
        newest = user_password(credentials.url(view(), record(30)))
        assert second.ask(*newest) == "OK"
        assert checker.ask(*new).startswith("ERR")
    finally:
        second.close()


def test_the_probe_credential_passes_without_fencing_or_being_fenced(checker: Helper) -> None:
    views = {UID: view()}
    header = ProbeCredentials(MASTER, lambda: views)("http://192.0.2.7:3128")
    scheme_name, _, encoded = header.partition(" ")
    assert scheme_name == "Basic"
    user, _, password = base64.b64decode(encoded).decode().partition(":")
    assert user.startswith(f"{scheme.PROBE_USER}.")
    holder = user_password(LeaseCredentials(MASTER).url(view(), record(50)))
    assert checker.ask(*holder) == "OK"
    assert checker.ask(user, password) == "OK"
    assert checker.ask(*holder) == "OK"
    assert checker.ask(user, "x").startswith("ERR")
    assert checker.ask(scheme.PROBE_USER, password).startswith("ERR")  # the fixed name of old
    stale = scheme.probe_credential(scheme.proxy_key(MASTER, UID), 1_000)
    assert checker.ask(*stale) == 'ERR message="lease expired"'


def test_bad_lines_and_a_missing_key_get_answers_not_a_crash(
    tmp_path: Path, checker: Helper
) -> None:
    assert checker.ask("someone", "not-a-credential").startswith("ERR")
    assert checker.ask(scheme.PROBE_USER, "1.2.3").startswith("ERR")
    keyless = Helper(tmp_path / "missing.key", tmp_path / "state")
    try:
        assert keyless.ask("u", "1.2.abc").startswith("BH ")
    finally:
        keyless.close()


def test_the_vm_script_is_valid_shell_and_ships_the_helper_verbatim(tmp_path: Path) -> None:
    key = scheme.proxy_key(MASTER, UID).hex()
    script = cloudinit.lease_script(key, helper_source())
    checked = subprocess.run(
        ["sh", "-n"], input=script, text=True, capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
    start = script.index("<<'EGRESS_LEASE_EOF'\n") + len("<<'EGRESS_LEASE_EOF'\n")
    shipped = script[start : script.index("\nEGRESS_LEASE_EOF\n", start)]
    assert shipped == helper_source().rstrip()
    (tmp_path / "shipped.py").write_text(shipped)
    (tmp_path / "key").write_text(key + "\n")
    user, password = user_password(LeaseCredentials(MASTER).url(view(), record(3)))
    answered = subprocess.run(
        [
            *(sys.executable, str(tmp_path / "shipped.py"), "--key-file", str(tmp_path / "key")),
            *("--state-file", str(tmp_path / "fence")),
        ],
        input=f"{quote(user, safe='')} {quote(password, safe='')}\n",
        check=False,
        text=True,
        capture_output=True,
        timeout=10,
    )
    assert answered.stdout == f"OK lease={user.rsplit('.', 3)[0]}\n"
