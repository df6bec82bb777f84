"""``--providers-config``: what loads, and the message every mistake gets."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from services.providers.config import (
    MAX_FILE_BYTES,
    PROVIDER_TYPES,
    Loaded,
    ProviderEntry,
    ProviderType,
    build_providers,
    decode_config_text,
    load_providers_config,
    read_config_file,
)
from services.providers.local import LocalConfig, LocalProvider
from services.runtime.settings.errors import ConfigError
from services.testing.provider import FakeConfig, FakeProvider

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    return path


def test_no_file_means_one_local_provider_under_the_data_dir(tmp_path: Path) -> None:
    entries = load_providers_config(None, default_data_dir=tmp_path)
    assert entries == [
        ProviderEntry("local", "local", LocalConfig(data_dir=str(tmp_path / "local")))
    ]
    providers = build_providers(entries)
    local = providers["local"]
    assert isinstance(local, LocalProvider)
    assert local.data_dir == (tmp_path / "local").resolve()


def test_full_example_builds_every_entry(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
providers:
  - name: local
    type: local
    local: {dataDir: state/local, backend: proxypy, portRange: "21000-21999", stopGraceSeconds: 1}
  - name: fake-1
    type: fake
    fake: {latency: 0.01, pendingPolls: 2}
  - name: fake_2
    type: fake
    fake:
""",
    )
    entries = load_providers_config(path, default_data_dir=tmp_path / "default")
    assert [(e.name, e.type) for e in entries] == [
        ("local", "local"),
        ("fake-1", "fake"),
        ("fake_2", "fake"),
    ]
    assert entries[0].config == LocalConfig(
        data_dir=str(tmp_path / "state/local"),
        backend="proxypy",
        port_range="21000-21999",
        stop_grace_seconds=1.0,
    )
    assert entries[1].config == FakeConfig(latency=0.01, pending_polls=2)
    providers = build_providers(entries)
    local, fake = providers["local"], providers["fake-1"]
    assert isinstance(local, LocalProvider)
    assert (local.backend, local.port_range, local.stop_grace) == ("proxypy", (21000, 21999), 1.0)
    assert isinstance(fake, FakeProvider)
    assert (fake.name, fake.latency, fake.pending_polls) == ("fake-1", 0.01, 2)
    assert isinstance(providers["fake_2"], FakeProvider)


def test_empty_and_absolute_data_dirs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
providers:
  - {{name: a, type: local, local: {{}}}}
  - {{name: b, type: local, local: {{dataDir: {tmp_path / "abs"}}}}}
""",
    )
    a, b = load_providers_config(path, default_data_dir=tmp_path / "d")
    assert isinstance(a.config, LocalConfig)
    assert isinstance(b.config, LocalConfig)
    assert a.config.data_dir == str(tmp_path / "d" / "a")
    assert b.config.data_dir == str(tmp_path / "abs")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("providers: []", r"`providers` is empty; list at least one"),
        ("- name: x", r"expected a mapping with a `providers:` list"),
        ("providers: [{type: fake, fake: {}}], extra: 1", r"not valid YAML"),
        ("providers: [{type: fake, fake: {}}]\nextra: 1", r"unknown top-level keys \['extra'\]"),
        ("providers: [a]", r"providers\[0\]: expected a mapping with `name`, `type`"),
        ("providers: [{type: fake, fake: {}}]", r"providers\[0\]: `name` is required"),
        ("providers: [{name: '', type: fake}]", r"providers\[0\]: `name` is required"),
        (
            "providers: [{name: a.b, type: fake, fake: {}}]",
            r"providers\[0\] \(a\.b\): `name` must be 1-63 letters",
        ),
        (
            "providers: [{name: os, type: openstack, openstack: {}}]",
            r"providers\[0\] \(os\): `type` is 'openstack'; use one of aws, digitalocean, fake, "
            "gcp, hetzner, kubernetes, kvm, local",
        ),
        (
            "providers: [{name: l, local: {}}]",
            r"providers\[0\] \(l\): `type` is missing; use one of aws, digitalocean, fake, gcp, "
            "hetzner, kubernetes, kvm, local",
        ),
        (
            "providers: [{name: f, type: fake}]",
            r"providers\[0\] \(f\): expected exactly one settings block `fake:`.* found none",
        ),
        (
            "providers: [{name: f, type: fake, local: {}}]",
            r"\(f\): expected exactly one settings block `fake:` .*found `local`; put",
        ),
        (
            "providers: [{name: f, type: fake, fake: {}, local: {}}]",
            r"\(f\): expected exactly one settings block `fake:` .*found `fake`, `local`",
        ),
        (
            "providers: [{name: f, type: fake, fake: {latency: fast}}]",
            r"providers\[0\] \(f\): fake\.latency: Expected `float`, got `str`",
        ),
        (
            "providers: [{name: f, type: fake, fake: {pendingPolls: -1}}]",
            r"\(f\): fake\.pendingPolls: Expected `int` >= 0",
        ),
        (
            "providers: [{name: f, type: fake, fake: {latncy: 1}}]",
            r"\(f\): fake: Object contains unknown field `latncy`",
        ),
        (
            "providers: [{name: f, type: fake, fake: [1]}]",
            r"\(f\): fake: Expected `object`, got `array`",
        ),
        (
            "providers: [{name: l, type: local, local: {portRange: 30000-20000}}]",
            r"\(l\): local: portRange '30000-20000': use LOW-HIGH",
        ),
        (
            "providers: [{name: l, type: local, local: {portRange: lots}}]",
            r"\(l\): local\.portRange: Expected `str` matching regex",
        ),
        (
            "providers: [{name: l, type: local, local: {backend: docker}}]",
            r"\(l\): local\.backend: Invalid enum value 'docker'",
        ),
        (
            "providers:\n- {name: f, type: fake, fake: {}}\n- {name: f, type: fake, fake: {}}",
            r"providers\[1\] \(f\): the name is already used by providers\[0\]",
        ),
    ],
)
def test_mistakes_name_the_entry_and_the_fix(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=expected) as caught:
        load_providers_config(path, default_data_dir=tmp_path)
    assert str(path) in str(caught.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--providers-config .*nope\.yaml: cannot read it"):
        load_providers_config(tmp_path / "nope.yaml", default_data_dir=tmp_path)


def test_build_reports_an_unknown_type_and_factory_failures(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"providers\[0\] \(k\): unknown type 'openstack'"):
        build_providers([ProviderEntry("k", "openstack", FakeConfig())])
    with pytest.raises(ConfigError, match=r"providers\[1\] \(l\): .*local\.dataDir is required"):
        build_providers(
            [ProviderEntry("f", "fake", FakeConfig()), ProviderEntry("l", "local", LocalConfig())]
        )


def test_every_registered_type_loads() -> None:
    for kind in PROVIDER_TYPES.values():
        config, factory = kind.load()
        assert callable(factory)
        assert config.__struct_config__.forbid_unknown_fields


# ---------------------------------------------------------------------- files that are no YAML


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x7fELF\x02\x01\x00\x00", r"a binary file \(a NUL byte at offset 6\)"),
        (b"providers:\n  - name: caf\xe9\n", r"not UTF-8 text \(byte 0xe9 at offset 24\)"),
        ("providers: []\n".encode("utf-16"), "UTF-16 text; save it as UTF-8"),
        (b"a: [\n", r"not valid YAML \(.*at line 2, column 1\)"),
        (b"a: \x1b\n", r"not valid YAML \(character U\+001B at offset 3"),
        (b"[" * 5000, r"not valid YAML \(nested too deeply\)"),
    ],
)
def test_a_file_that_is_no_yaml_text_is_one_line_naming_it(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=problem) as caught:
        load_providers_config(path, default_data_dir=tmp_path)
    assert str(caught.value).startswith(f"--providers-config {path}: ")
    assert "\n" not in str(caught.value)


def test_a_directory_is_no_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read it \(Is a directory\)"):
        read_config_file(tmp_path, "-f")


def test_a_byte_order_mark_is_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    path.write_bytes(b"\xef\xbb\xbfproviders: [{name: f, type: fake, fake: {}}]\n")
    assert [e.name for e in load_providers_config(path, default_data_dir=tmp_path)] == ["f"]


def test_reading_stops_past_the_limit() -> None:
    with pytest.raises(ConfigError, match="more than 32 MiB"):
        decode_config_text(b"a" * (MAX_FILE_BYTES + 1), "-f big.yaml")


# -------------------------------------------------------------------- optional dependencies


def importing(module: str) -> Loaded:
    """A loader that imports ``module``, as the real ones import a provider's module."""
    importlib.import_module(module)
    raise AssertionError(f"{module} was not expected to exist")


def test_a_type_whose_dependency_is_missing_names_the_extra_to_install(tmp_path: Path) -> None:
    kind = ProviderType(lambda: importing("services.providers.no_such_module"), extra="kvm")
    # A module of ours that is missing is a bug, not a setting: it stays an ImportError.
    with pytest.raises(ModuleNotFoundError):
        kind.load()
    absent = ProviderType(lambda: importing("no_such_dependency_anywhere"), extra="kvm")
    with pytest.raises(
        ConfigError, match=r"no_such_dependency_anywhere.*pip install 'egress-proxies\[kvm\]'"
    ):
        absent.load()
    bare = ProviderType(lambda: importing("no_such_dependency_anywhere"))
    with pytest.raises(ConfigError, match="reinstall egress-proxies"):
        bare.load()


def test_the_types_with_optional_clients_name_their_extras() -> None:
    extras = {name: t.extra for name, t in PROVIDER_TYPES.items() if t.extra is not None}
    assert extras == {
        "kvm": "kvm",
        "aws": "aws",
        "digitalocean": "digitalocean",
        "hetzner": "hetzner",
    }
    # Each extra exists in the package's metadata, so the message's pip install works.
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(extras.values()) <= set(declared["optional-dependencies"])
