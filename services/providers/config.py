"""``--providers-config``: the named provider instances a Proxy's ``spec.provider`` can refer to.

```yaml
providers:
  - name: local            # what spec.provider refers to
    type: local
    local: {dataDir: /var/lib/egress-proxies/local, backend: auto, portRange: "20000-29999"}
  - name: fake-1
    type: fake
    fake: {latency: 0.01, pendingPolls: 2}
  - name: behind-gateway
    type: local
    auth: none             # proxies serve without lease credentials (default: lease)
    local: {}
```

Each entry carries exactly one settings block, keyed by its type, so a block pasted under the wrong
type fails loudly instead of being ignored. Types are looked up in ``PROVIDER_TYPES`` and imported
only when used: a config naming only ``local`` must not need a cloud SDK installed. A relative
``dataDir`` is relative to the config file; an empty one defaults to ``<data dir>/<name>``.

Every mistake is a ``ConfigError`` naming the entry (index and name), the field and the fix, at
start-up: a typo in a provider block would otherwise surface as failed proxies much later. So is a
type whose optional dependency is not installed (``kvm`` needs libvirt-python): the message names
the extra to install.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, cast

import msgspec
import structlog
import yaml

from services.providers.base import Provider
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.secret import HOW, master_secret_from_env
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.providers")

Factory = Callable[[str, Any], Provider]
# The same rule as spec.provider (events.proxyresource), or no Proxy could ever refer to the entry.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")
_FLAG = "--providers-config"
_OWN_PACKAGES = frozenset({"events", "projections", "commands", "services"})
AUTH_LEASE = "lease"
AUTH_NONE = "none"
AUTH_MODES = (AUTH_LEASE, AUTH_NONE)
LEASE_TYPES = frozenset(
    {"local", "kubernetes", "gcp", "kvm", "aws", "digitalocean", "hetzner", "upstream"}
)
"""Types whose proxies enforce leases unless their entry says ``auth: none`` (D84)."""
MAX_FILE_BYTES = 32 * 1024 * 1024
"""Larger than any file a person writes; reading stops there (a device like /dev/zero ends)."""


def read_config_file(path: Path, label: str) -> str:
    """The text of a file an operator named, or a one-line ``ConfigError`` with the path and the
    problem: missing, a directory, unreadable, too large, binary, or not UTF-8."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{label} {path}: cannot read it ({exc.strerror or exc})") from exc
    return decode_config_text(data, f"{label} {path}")


def decode_config_text(data: bytes, where: str) -> str:
    """UTF-8 text (a byte-order mark is allowed: some editors write one), or a ``ConfigError``."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ConfigError(f"{where}: UTF-16 text; save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"{where}: a binary file (a NUL byte at offset {nul}), not YAML text")
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: more than {MAX_FILE_BYTES // 2**20} MiB; not a YAML file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8"
        ) from exc


def yaml_problem(exc: Exception) -> str:
    """A YAML parser's complaint on one line, with the line and column it points at.

    ``exc`` is a ``yaml.YAMLError``, or the ``RecursionError`` of a document nested too deeply.
    """
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f"{exc.context}: " if exc.context else ""
        return f"{context}{exc.problem}{where}"
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character U+{exc.character:04X} at offset {exc.position} is not allowed in YAML"
    return " ".join(str(exc).split())


Loaded = tuple[type[msgspec.Struct], Factory]


@dataclass(frozen=True, slots=True)
class ProviderType:
    """How to import a type's settings struct and factory, on first use; ``extra`` is the
    package extra that installs its optional dependencies. The imports are written out in the
    loader functions below (not module names in strings), so the import contracts see them."""

    importer: Callable[[], Loaded]
    extra: str | None = None

    def load(self) -> Loaded:
        try:
            return self.importer()
        except ImportError as exc:
            missing = exc.name or ""
            if missing.partition(".")[0] in _OWN_PACKAGES:
                raise  # our own module is broken: a bug, not a setting
            fix = (
                f"pip install 'egress-proxies[{self.extra}]'"
                if self.extra
                else "reinstall egress-proxies"
            )
            raise ConfigError(
                f"needs the Python module {missing or '?'}, which cannot be imported "
                f"({exc}); install it: {fix}"
            ) from exc


def _local() -> Loaded:
    from services.providers.local import LocalConfig, LocalProvider  # noqa: PLC0415 - on first use

    return LocalConfig, cast(Factory, LocalProvider.from_config)


def _fake() -> Loaded:
    from services.providers.fake import FakeConfig, FakeProvider  # noqa: PLC0415 - on first use

    return FakeConfig, cast(Factory, FakeProvider.from_config)


def _gcp() -> Loaded:
    # google-cloud-compute takes a second to import: only a config that names gcp pays for it.
    from services.providers.gcp.provider import GcpConfig, GcpProvider  # noqa: PLC0415

    return GcpConfig, cast(Factory, GcpProvider.from_config)


def _kubernetes() -> Loaded:
    from services.providers.kubernetes.provider import (  # noqa: PLC0415 - on first use
        KubernetesConfig,
        KubernetesProvider,
    )

    return KubernetesConfig, cast(Factory, KubernetesProvider.from_config)


def _kvm() -> Loaded:
    # libvirt-python is an optional extra: a missing one is a setting, reported with the fix.
    from services.providers.kvm.provider import KvmConfig, KvmProvider  # noqa: PLC0415

    return KvmConfig, cast(Factory, KvmProvider.from_config)


def _aws() -> Loaded:
    # aiobotocore is an optional extra: a missing one is a setting, reported with the fix.
    from services.providers.aws.provider import AwsConfig, AwsProvider  # noqa: PLC0415

    return AwsConfig, cast(Factory, AwsProvider.from_config)


def _digitalocean() -> Loaded:
    # pydo is an optional extra: a missing one is a setting, reported with the fix.
    from services.providers.digitalocean.provider import (  # noqa: PLC0415
        DigitalOceanConfig,
        DigitalOceanProvider,
    )

    return DigitalOceanConfig, cast(Factory, DigitalOceanProvider.from_config)


def _hetzner() -> Loaded:
    # hcloud is an optional extra: a missing one is a setting, reported with the fix.
    from services.providers.hetzner.provider import HetznerConfig, HetznerProvider  # noqa: PLC0415

    return HetznerConfig, cast(Factory, HetznerProvider.from_config)


def _upstream() -> Loaded:
    from services.providers.upstream.config import UpstreamConfig  # noqa: PLC0415 - on first use
    from services.providers.upstream.provider import UpstreamProvider  # noqa: PLC0415

    return UpstreamConfig, cast(Factory, UpstreamProvider.from_config)


PROVIDER_TYPES: dict[str, ProviderType] = {
    "local": ProviderType(_local),
    "fake": ProviderType(_fake),
    "gcp": ProviderType(_gcp),
    "kubernetes": ProviderType(_kubernetes),
    "kvm": ProviderType(_kvm, extra="kvm"),
    "aws": ProviderType(_aws, extra="aws"),
    "digitalocean": ProviderType(_digitalocean, extra="digitalocean"),
    "hetzner": ProviderType(_hetzner, extra="hetzner"),
    "upstream": ProviderType(_upstream),
}


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    name: str
    type: str
    config: msgspec.Struct
    auth: str = AUTH_LEASE
    """``lease``: its proxies refuse requests without a current lease's credentials; ``none``:
    they serve anyone allowed to reach them (a gateway of your own in front)."""

    @property
    def enforces_leases(self) -> bool:
        return self.auth == AUTH_LEASE and self.type in LEASE_TYPES


def load_providers_config(path: Path | None, *, default_data_dir: Path) -> list[ProviderEntry]:
    """The entries of ``path``; without a file, the one provider every install has: ``local``."""
    if path is None:
        config_type, _ = PROVIDER_TYPES["local"].load()
        config = msgspec.convert({"dataDir": str(default_data_dir / "local")}, config_type)
        return [ProviderEntry("local", "local", config)]
    text = read_config_file(path, _FLAG)
    try:
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"{_FLAG} {path}: not valid YAML ({yaml_problem(exc)})") from exc
    return parse_providers_config(
        raw, source=str(path), base_dir=path.parent, default_data_dir=default_data_dir
    )


def parse_providers_config(
    raw: object, *, source: str, base_dir: Path, default_data_dir: Path
) -> list[ProviderEntry]:
    """Validate an already-decoded document (the file, or an embedded value)."""
    where = f"{_FLAG} {source}"
    if not isinstance(raw, dict) or not isinstance(raw.get("providers"), list):
        raise ConfigError(f"{where}: expected a mapping with a `providers:` list at the top")
    extra = sorted(str(k) for k in raw if k != "providers")
    if extra:
        raise ConfigError(f"{where}: unknown top-level keys {extra}; only `providers` is allowed")
    if not raw["providers"]:
        raise ConfigError(f"{where}: `providers` is empty; list at least one provider")
    entries: list[ProviderEntry] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw["providers"]):
        entry = _parse_entry(index, item, where, base_dir, default_data_dir)
        if entry.name in seen:
            raise ConfigError(
                f"{where}: providers[{index}] ({entry.name}): the name is already used by "
                f"providers[{seen[entry.name]}]; give every entry its own name"
            )
        seen[entry.name] = index
        entries.append(entry)
    return entries


def _parse_entry(
    index: int, item: object, where: str, base_dir: Path, default_data_dir: Path
) -> ProviderEntry:
    label = f"{where}: providers[{index}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{label}: expected a mapping with `name`, `type` and a settings block")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{label}: `name` is required: what spec.provider refers to, e.g. local")
    label = f"{label} ({name})"
    if not _NAME.match(name):
        raise ConfigError(f"{label}: `name` must be 1-63 letters, digits, '_' or '-'")
    known = ", ".join(sorted(PROVIDER_TYPES))
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in PROVIDER_TYPES:
        shown = "missing" if kind is None else repr(kind)
        raise ConfigError(f"{label}: `type` is {shown}; use one of {known}")
    auth = item.get("auth", AUTH_LEASE)
    if auth not in AUTH_MODES:
        raise ConfigError(
            f"{label}: `auth` is {auth!r}; use lease (the default: leases are enforced at the "
            "proxy) or none (no credentials asked)"
        )
    blocks = [str(k) for k in item if k not in ("name", "type", "auth")]
    if blocks != [kind]:
        wrong = ", ".join(f"`{b}`" for b in blocks) or "none"
        raise ConfigError(
            f"{label}: expected exactly one settings block `{kind}:` (the key equals the type), "
            f"found {wrong}; put this provider's settings under `{kind}:` ({{}} for defaults)"
        )
    block = item[kind] if item[kind] is not None else {}
    config_type, _ = _load(kind, label)
    try:
        config = msgspec.convert(block, config_type)
    except msgspec.ValidationError as exc:
        message, _, path = str(exc).partition(" - at `")
        field = kind + path.rstrip("`").removeprefix("$")
        raise ConfigError(f"{label}: {field}: {message}") from exc
    config = _default_data_dir(config, name, base_dir, default_data_dir)
    return ProviderEntry(name, kind, config, auth=str(auth))


def _load(kind: str, label: str) -> tuple[type[msgspec.Struct], Factory]:
    try:
        return PROVIDER_TYPES[kind].load()
    except ConfigError as exc:
        raise ConfigError(f"{label}: type {kind} {exc}") from exc


def _default_data_dir(
    config: msgspec.Struct, name: str, base_dir: Path, default_data_dir: Path
) -> msgspec.Struct:
    """Any type with a ``dataDir`` gets the same defaulting and the same relative base."""
    data_dir = getattr(config, "data_dir", None)
    if not isinstance(data_dir, str):
        return config
    resolved = base_dir / Path(data_dir).expanduser() if data_dir else default_data_dir / name
    return msgspec.structs.replace(config, data_dir=str(resolved))


def check_lease_secret(entries: list[ProviderEntry]) -> bytes | None:
    """The master lease secret, required when an entry enforces leases: the executor checks
    it at start-up (``executor.build``), so a missing one stops the command instead of leaving
    proxies that no lease can open, or that do not enforce any."""
    secret = master_secret_from_env()
    enforcing = [(i, e) for i, e in enumerate(entries) if e.enforces_leases]
    if enforcing and secret is None:
        index, entry = enforcing[0]
        raise ConfigError(
            f"{_FLAG}: providers[{index}] ({entry.name}) enforces leases at its proxies and "
            f"needs the lease secret: {HOW}; or give the entry `auth: none`"
        )
    return secret


def build_providers(
    entries: list[ProviderEntry], *, lease_secret: bytes | None = None
) -> dict[str, Provider]:
    """One provider per entry, by name. Constructors do no I/O, so a failure here is a setting
    (a backend that is not installed), reported like the others. An entry that enforces leases
    hands its instances their proxy keys, made from ``lease_secret`` (else the environment's);
    without one (a library user who did not ``check_lease_secret``) its proxies enforce
    nothing, and a warning says so."""
    providers: dict[str, Provider] = {}
    if lease_secret is None and any(e.enforces_leases for e in entries):
        lease_secret = master_secret_from_env()
    for index, entry in enumerate(entries):
        provider = build_unwrapped(entry, index)
        if entry.enforces_leases:
            if lease_secret is not None:
                provider = lease_keyed(provider, lease_secret)
            else:
                log.warning(
                    "no lease secret: this provider's new proxies will not enforce leases",
                    provider=entry.name,
                    fix=HOW,
                )
        providers[entry.name] = provider
    return providers


def build_unwrapped(entry: ProviderEntry, index: int = 0) -> Provider:
    """``entry``'s provider as its type's factory makes it, without the lease key and the
    instruments ``build_providers`` adds: what a preflight asks its cloud through (the wrappers
    play no part in what a cloud answers). ``index`` is the entry's place, for the message."""
    label = f"{_FLAG}: providers[{index}] ({entry.name})"
    if entry.type not in PROVIDER_TYPES:
        known = ", ".join(sorted(PROVIDER_TYPES))
        raise ConfigError(f"{label}: unknown type {entry.type!r}; use one of {known}")
    _, factory = _load(entry.type, label)
    try:
        return factory(entry.name, entry.config)
    except ConfigError as exc:
        raise ConfigError(f"{label}: {exc}") from exc


def _set_gcp_wire_log(full: bool) -> None:
    """A process-wide logging setting, like the log level: set where the flag is parsed, so no
    service signature carries it. Imported here, not at the top: the registry stays free of any
    one provider type's modules."""
    from services.providers.gcp.pure import wirelog  # noqa: PLC0415 (see docstring)

    wirelog.set_full_payloads(full)


class ProviderSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The settings of every service that talks to providers (executor, gc), and of the commands
    that do (``gc run-once``, ``providers check``): one definition, so `up` shows them once and
    both services read the same file (docs/decisions/0148-one-settings-struct-per-service.md)."""

    providers_config: Annotated[
        Path | None,
        setting(
            "Named provider instances (YAML); without it, one `local` provider.",
            path="file",
            exists=True,
            show_default=False,
        ),
    ] = None
    data_dir: Annotated[
        Path,
        setting(
            "Where local providers keep their data, unless the config says otherwise.",
            path="dir",
        ),
    ] = Path(".data")
    gcp_wire_log_full_payloads: Annotated[
        bool,
        setting(
            "Debug wire logs of gcp providers show string fields over 1 KiB (cloud-init) in "
            "full; tokens stay redacted.",
            show_default=False,
        ),
    ] = False

    def apply(self) -> None:
        """Set what is process-wide, like the log level, so no provider's signature carries it:
        called by whoever builds the providers from these settings."""
        _set_gcp_wire_log(self.gcp_wire_log_full_payloads)
