"""Leases enforced at the proxy (D84): the secret, the providers' `auth` setting, and what each
kind of instance is given (Squid config, pod, cloud-init)."""

from __future__ import annotations

import email.parser
import email.policy
import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from events.schemas import ProxySpec
from services.providers.base import CreateRequest, Instance
from services.providers.config import (
    ProviderEntry,
    build_providers,
    check_lease_secret,
    load_providers_config,
)
from services.providers.kubernetes.config import KubernetesConfig
from services.providers.kubernetes.pure.mapping import LEASE_DIR, build_pod
from services.providers.local import LocalConfig, LocalProvider
from services.providers.pure.squidconf import SquidAuth, squid_config
from services.providers.squidauth.keyed import (
    LeaseKeyed,
    helper_source,
    lease_auth_for,
    lease_keyed,
)
from services.providers.squidauth.pure import cloudinit, scheme
from services.providers.squidauth.secret import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    ensure_secret_file,
    master_secret_from_env,
)
from services.runtime.settings.errors import ConfigError

MASTER = b"unit-test-master-secret-0123456789"
UID = "owner-uid-1"


@pytest.fixture(autouse=True)
def no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)


def request(cloud_init: str = "", **kw: object) -> CreateRequest:
    return CreateRequest(
        name="px-1",
        owner_uid=UID,
        namespace="crawl",
        proxy_name="p1",
        spec=ProxySpec(),
        cloud_init=cloud_init,
        **kw,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------------------ secret


def test_the_secret_comes_from_the_variable_or_a_file(tmp_path: Path) -> None:
    assert master_secret_from_env({}) is None
    assert master_secret_from_env({SECRET_ENV: " " + MASTER.decode() + "\n"}) == MASTER
    path = tmp_path / "secret"
    path.write_text(MASTER.decode() + "\n")
    assert master_secret_from_env({SECRET_FILE_ENV: str(path)}) == MASTER


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({SECRET_ENV: "short"}, "fewer than 16"),
        ({SECRET_ENV: MASTER.decode(), SECRET_FILE_ENV: "/x"}, "both set"),
        ({SECRET_FILE_ENV: "/nonexistent/secret"}, "cannot read"),
    ],
)
def test_a_bad_secret_is_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as caught:
        master_secret_from_env(env)
    assert "EGRESS_LEASE_SECRET" in str(caught.value)
    assert "short" not in str(caught.value)  # never the secret itself


def test_up_makes_a_secret_once_and_keeps_it(tmp_path: Path) -> None:
    path = ensure_secret_file(tmp_path / "data")
    first = path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_secret_file(tmp_path / "data").read_text() == first
    assert master_secret_from_env({SECRET_FILE_ENV: str(path)}) == first.strip().encode()


# ------------------------------------------------------------------------------ config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    return path


def test_auth_is_lease_unless_an_entry_says_none(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
providers:
  - {name: a, type: local, local: {}}
  - {name: b, type: local, auth: none, local: {}}
  - {name: f, type: fake, fake: {}}
""",
    )
    entries = load_providers_config(path, default_data_dir=tmp_path)
    assert [(e.auth, e.enforces_leases) for e in entries] == [
        ("lease", True),
        ("none", False),
        ("lease", False),  # a fake has no proxy to enforce anything
    ]


def test_an_unknown_auth_is_refused_naming_the_entry_and_the_choices(tmp_path: Path) -> None:
    path = write(tmp_path, "providers:\n  - {name: a, type: local, auth: basic, local: {}}\n")
    with pytest.raises(ConfigError, match=r"providers\[0\] \(a\): `auth` is 'basic'; use lease"):
        load_providers_config(path, default_data_dir=tmp_path)


def test_enforcing_needs_the_secret_and_says_how_to_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enforcing = [ProviderEntry("a", "local", LocalConfig(data_dir=str(tmp_path)))]
    with pytest.raises(ConfigError) as caught:
        check_lease_secret(enforcing)
    message = str(caught.value)
    assert "providers[0] (a)" in message
    assert SECRET_ENV in message
    assert "auth: none" in message
    relaxed = [ProviderEntry("a", "local", LocalConfig(data_dir=str(tmp_path)), auth="none")]
    assert check_lease_secret(relaxed) is None
    monkeypatch.setenv(SECRET_ENV, MASTER.decode())
    assert check_lease_secret(enforcing) == MASTER


def test_enforcing_providers_hand_out_keys_and_others_do_not(tmp_path: Path) -> None:
    entries = [
        ProviderEntry("a", "local", LocalConfig(data_dir=str(tmp_path / "a"))),
        ProviderEntry("b", "local", LocalConfig(data_dir=str(tmp_path / "b")), auth="none"),
    ]
    built = build_providers(entries, lease_secret=MASTER)
    assert isinstance(built["a"], LeaseKeyed)
    assert isinstance(built["a"].inner, LocalProvider)
    assert isinstance(built["b"], LocalProvider)
    assert MASTER.decode() not in repr(built["a"])


@dataclass
class Recording:
    """A provider that keeps what it was asked to create."""

    type: str
    name: str = "rec"
    requests: list[CreateRequest] = field(default_factory=list)

    async def create(self, request: CreateRequest) -> str:
        self.requests.append(request)
        return request.name

    async def get(self, provider_id: str) -> Instance:
        raise NotImplementedError

    async def delete(self, provider_id: str) -> None:
        raise NotImplementedError

    async def list_by_tag(self) -> list[Instance]:
        return []

    async def close(self) -> None:
        pass


async def test_a_key_is_per_proxy_and_vms_get_it_through_cloud_init() -> None:
    local, vm = Recording("local"), Recording("gcp")
    await lease_keyed(local, MASTER).create(request("#cloud-config\n{}\n"))
    await lease_keyed(vm, MASTER).create(request("#cloud-config\n{}\n"))
    key = scheme.proxy_key(MASTER, UID).hex()
    [seen] = local.requests
    assert seen.lease_auth is not None
    assert seen.lease_auth.key == key
    assert seen.cloud_init == "#cloud-config\n{}\n"  # a local proxy runs no cloud-init
    assert key not in repr(seen)
    [booted] = vm.requests
    assert booted.cloud_init.startswith("Content-Type: multipart/mixed")
    assert [kind for kind, _ in parts(booted.cloud_init)] == ["text/plain", "text/x-shellscript"]
    assert key in parts(booted.cloud_init)[1][1]


# ------------------------------------------------------------------------ squid config


def test_without_credentials_no_rule_can_allow_a_request() -> None:
    config = squid_config(
        listen="3128",
        name="n",
        cache_log="/dev/stderr",
        coredump_dir="/tmp",
        allowed_clients=("10.0.0.0/8",),
        auth=SquidAuth(program="/usr/bin/python3 /h.py --key-file /k --state-file /s"),
    )
    lines = config.splitlines()
    access = [line for line in lines if line.startswith("http_access")]
    assert access[0] == "http_access deny !egress_lease"
    assert "auth_param basic credentialsttl 1 second" in lines
    assert any(line.endswith("--state-file /s --concurrent") for line in lines)
    assert lines.index("acl egress_lease proxy_auth REQUIRED") < lines.index(access[0])


# ------------------------------------------------------------------------- kubernetes


def test_a_pod_that_enforces_leases_gets_its_key_helper_and_state_volume() -> None:
    config = KubernetesConfig()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    plain = build_pod(request(), config, "k8s", now)
    assert "volumes" not in plain["spec"]
    auth = lease_auth_for(MASTER, UID)
    pod = build_pod(request(lease_auth=auth), config, "k8s", now)
    [container] = pod["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["EGRESS_LEASE_KEY"] == auth.key
    assert env["EGRESS_LEASE_HELPER"] == helper_source()
    assert "http_access deny !egress_lease" in env["SQUID_CONF"]
    assert f"{LEASE_DIR}/lease-auth.py" in env["SQUID_CONF"]
    script = container["command"][2]
    assert "command -v python3" in script
    assert "unset EGRESS_LEASE_KEY" in script
    assert container["volumeMounts"] == [{"name": "egress-lease", "mountPath": LEASE_DIR}]
    assert pod["spec"]["volumes"] == [{"name": "egress-lease", "emptyDir": {}}]


# ------------------------------------------------------------------------- cloud-init


def parts(user_data: str) -> list[tuple[str, str]]:
    message = email.parser.Parser(policy=email.policy.default).parsestr(user_data)
    assert message.is_multipart()
    found = []
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        found.append((part.get_content_type(), payload.decode()))
    return found


def test_the_users_cloud_init_stays_a_part_of_its_own_and_ours_comes_last() -> None:
    theirs = "#cloud-config\npackages: [squid]\nwrite_files:\n  - {path: /x, content: é}\n"
    found = parts(cloudinit.with_lease_auth(theirs, "ab" * 32, helper_source()))
    assert found[0] == ("text/plain", theirs)
    kind, script = found[1]
    assert kind == "text/x-shellscript"
    assert "ab" * 32 in script
    assert helper_source().rstrip() in script
    assert cloudinit.SNIPPET_PATH in script
    assert "http_access deny !egress_lease" in script


def test_multipart_user_data_gets_our_part_appended_and_empty_gets_ours_alone() -> None:
    first = cloudinit.with_lease_auth("#!/bin/sh\necho hi\n", "cd" * 32, helper_source())
    again = parts(cloudinit.with_lease_auth(first, "ef" * 32, helper_source()))
    assert [kind for kind, _ in again] == ["text/plain", "text/x-shellscript", "text/x-shellscript"]
    alone = parts(cloudinit.with_lease_auth("", "01" * 32, helper_source()))
    assert [kind for kind, _ in alone] == ["text/x-shellscript"]
