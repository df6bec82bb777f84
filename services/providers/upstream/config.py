"""The ``upstream:`` block of a providers-config entry, validated when the file is read
(docs/providers.md, "upstream"; docs/decisions/0160-upstream-proxy-services.md).

```yaml
providers:
  - name: resi-de
    type: upstream
    upstream:
      endpoint: gate.example-proxies.net:7000   # the service's gateway (an HTTP proxy)
      template: oxylabs          # or brightdata, decodo, iproyal; generic with username/password
      account: acme
      passwordFile: /etc/egress/resi-password    # or passwordEnv: RESI_PASSWORD
      sessionSeconds: 1800
      allowedCountries: [de, fr]
      maxBytesPerDay: 5000000000 # optional; kept, not enforced yet
      probeTarget: example.com:443  # what the preflight CONNECTs to through the service
      dataDir: ""                # the local Squids' records, as the local provider's
      portRange: "20000-29999"
```

Every check names the field and the fix: a mistake here would otherwise fail every proxy of the
entry, at whatever hour a pool scales. The account's password is never in this block: only
where to read it, and ``read_password`` reads it once, when the provider is built.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import msgspec

from services.providers.local import parse_port_range
from services.providers.pure.squidconf import parent_host
from services.providers.upstream.pure.templates import (
    COUNTRY,
    GENERIC,
    MAX_PASSWORD,
    NAMED,
    TEMPLATE_NAMES,
    TemplateError,
    Templates,
    checked,
)
from services.runtime.settings.errors import ConfigError

_PORT_RANGE = r"^\d{1,5}-\d{1,5}$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
MIN_SESSION_SECONDS = 60
MAX_SESSION_SECONDS = 86400
"""A minute (services count sessions in minutes) to a day (the longest Oxylabs and Decodo
keep one)."""
MAX_COUNTRIES = 250
MAX_PASSWORD_FILE = 4096


class UpstreamConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Settings of one named upstream provider: a proxy service's gateway and account."""

    endpoint: str
    template: str = GENERIC
    username: str = ""
    """``generic`` only: the user name template."""
    password: str = ""
    """``generic`` only: the password template (``{password}`` by default), never a password."""
    account: str = ""
    zone: str = ""
    password_file: str = ""
    password_env: str = ""
    session_seconds: Annotated[
        int, msgspec.Meta(ge=MIN_SESSION_SECONDS, le=MAX_SESSION_SECONDS)
    ] = 600
    allowed_countries: tuple[str, ...] = ()
    max_bytes_per_day: Annotated[int, msgspec.Meta(gt=0)] | None = None
    """Validated and kept; the daily budget itself is not enforced yet (D160)."""
    probe_target: str = "example.com:443"
    """The host:port the preflight asks the service to CONNECT to (nothing is sent through)."""
    data_dir: str = ""
    port_range: Annotated[str, msgspec.Meta(pattern=_PORT_RANGE)] = "20000-29999"
    stop_grace_seconds: Annotated[float, msgspec.Meta(ge=0)] = 3.0

    def __post_init__(self) -> None:
        problem = validate(self)
        if problem:
            raise ValueError(problem)

    @property
    def templates(self) -> Templates:
        """The checked templates (``validate`` passed, so this does not raise)."""
        if self.template == GENERIC:
            return checked(self.username, self.password or "{password}")
        return NAMED[self.template]

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.endpoint.rpartition(":")
        return parent_host(host.removeprefix("[").removesuffix("]")), int(port)


def endpoint_problem(
    endpoint: str,
    field: str = "endpoint",
    fix: str = "write the service's gateway as host:port, e.g. gate.example-proxies.net:7000",
) -> str:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{field} {endpoint[:64]!r} is not host:port; {fix}"
    bare = host.removeprefix("[").removesuffix("]")
    if ":" in bare and not (host.startswith("[") and host.endswith("]")):
        return f"{field} {endpoint[:64]!r}: an IPv6 address goes in brackets, [2001:db8::1]:7000"
    try:
        parent_host(bare)
    except ValueError as exc:
        return f"{field}: {exc}; {fix}"
    return ""


def _templates_problem(config: UpstreamConfig) -> str:
    if config.template not in TEMPLATE_NAMES:
        known = ", ".join(TEMPLATE_NAMES)
        return f"template {config.template[:64]!r} is not known; use one of {known}"
    if config.template != GENERIC:
        if config.username or config.password:
            return (
                f"username and password templates are for template generic; template "
                f"{config.template} writes its own: remove them, or use template generic"
            )
        return ""
    if not config.username:
        return (
            "template generic needs username, the service's user name grammar, e.g. "
            '"customer-{account}-country-{country}-session-{session}"'
        )
    try:
        checked(config.username, config.password or "{password}")
    except TemplateError as exc:
        return str(exc)
    return ""


def _identity_problem(config: UpstreamConfig) -> str:
    used = config.templates.placeholders
    for name in ("account", "zone"):
        value = getattr(config, name)
        if name in used and not value:
            return f"{name} is empty, and the template uses {{{name}}}: give the service's {name}"
        if value and not re.match(r"^[A-Za-z0-9._-]{1,128}\Z", value):
            return f"{name} {value[:64]!r}: use letters, digits, '.', '_' or '-' (at most 128)"
    return ""


def _password_source_problem(config: UpstreamConfig) -> str:
    if bool(config.password_file) == bool(config.password_env):
        both = "both are set" if config.password_file else "neither is set"
        return (
            f"give exactly one of passwordFile (a file holding the account's password) and "
            f"passwordEnv (the environment variable holding it); {both}"
        )
    if config.password_env and not _ENV_NAME.match(config.password_env):
        return (
            f"passwordEnv {config.password_env[:64]!r} is not a variable name; e.g. RESI_PASSWORD"
        )
    return ""


def _countries_problem(config: UpstreamConfig) -> str:
    if not config.allowed_countries:
        return "allowedCountries is empty; list the countries of the plan, e.g. [de, fr]"
    if len(config.allowed_countries) > MAX_COUNTRIES:
        return (
            f"allowedCountries has {len(config.allowed_countries)} entries; at most {MAX_COUNTRIES}"
        )
    for index, country in enumerate(config.allowed_countries):
        if not COUNTRY.match(country):
            return (
                f"allowedCountries[{index}] {country[:16]!r} is not an ISO 3166-1 alpha-2 code "
                "in lower case, e.g. de"
            )
    return ""


def validate(config: UpstreamConfig) -> str:
    """The first problem with ``config``, or ``""``."""
    problem = (
        endpoint_problem(config.endpoint)
        or endpoint_problem(
            config.probe_target,
            "probeTarget",
            "write a public site's host:443, e.g. example.com:443",
        )
        or _templates_problem(config)
        or _identity_problem(config)
        or _password_source_problem(config)
        or _countries_problem(config)
    )
    if problem:
        return problem
    try:
        parse_port_range(config.port_range)
    except ValueError as exc:
        return str(exc)
    return ""


def read_password(config: UpstreamConfig, entry: str) -> str:
    """The account's password from ``passwordFile`` or ``passwordEnv``, or ConfigError saying
    where it was looked for and what is wrong (never what was found). One trailing newline is
    dropped (an editor's, or ``echo``'s)."""
    if config.password_file:
        source = f"upstream.passwordFile {config.password_file}"
        try:
            with Path(config.password_file).open("rb") as file:
                raw = file.read(MAX_PASSWORD_FILE + 1)
        except OSError as exc:
            raise ConfigError(
                f"provider {entry!r}: {source}: cannot read it "
                f"({exc.strerror or type(exc).__name__}); mount or create it"
            ) from None
        if len(raw) > MAX_PASSWORD_FILE:
            raise ConfigError(
                f"provider {entry!r}: {source}: larger than any password; point it at the file "
                "holding the account's password alone"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                f"provider {entry!r}: {source}: not UTF-8 text; save the password as UTF-8"
            ) from None
    else:
        source = f"upstream.passwordEnv {config.password_env}"
        text = os.environ.get(config.password_env, "")
        if not _utf8(text):  # bytes that are no UTF-8 come as lone surrogates
            raise ConfigError(
                f"provider {entry!r}: {source}: not UTF-8 text; set the variable to the password "
                "as UTF-8"
            )
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise ConfigError(
            f"provider {entry!r}: {source} holds no password; put the account's password there"
        )
    if len(password) > MAX_PASSWORD or any(ord(c) < 0x20 or ord(c) == 0x7F for c in password):
        raise ConfigError(
            f"provider {entry!r}: {source}: the password holds a control character or a line "
            "break, or is too long (not shown); put the password alone on one line"
        )
    return password


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
