"""The ``upstream`` provider: a sticky session of a proxy service, served through a Squid of ours
(docs/decisions/0160-upstream-proxy-services.md).

An instance is a session. ``create`` mints a session id, picks the country from the proxy's
attributes, and starts a local Squid exactly as the local provider does (its records, ports,
process handling and lease enforcement, D84) with one difference: every request and CONNECT is
chained to the service's gateway, logging in with the session's user name and password. The
crawler holds our per-lease credentials for our Squid; the account's login is in that Squid's
config file alone (mode 0600), never on a command line, in the record, an event, a log line or an
error. The session id and country are kept in the record and shown as labels. Deleting an
instance stops its Squid: the service forgets an unused session by itself.

Each Squid logs every request and tunnel with the lease it served, and ``metered`` names those
logs to the executor's meter (docs/decisions/0161-metering-upstream-bytes.md).
"""

from __future__ import annotations

import secrets
import shutil
import string
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import structlog

from events.meter import MAX_BYTES
from events.schemas import ProxySpec
from services.providers import local_process as proc
from services.providers.base import CreateRequest, Permanent
from services.providers.local import InstanceMeta, LocalProvider, parse_port_range
from services.providers.preflight import Finding
from services.providers.pure.squidconf import Parent
from services.providers.pure.targets import AllowedTarget
from services.providers.upstream import probe
from services.providers.upstream.config import UpstreamConfig, read_password
from services.providers.upstream.pure.refusals import refusal
from services.providers.upstream.pure.templates import (
    FROM_ATTRIBUTES,
    TemplateError,
    Templates,
    Values,
    render,
)
from services.runtime.settings.errors import ConfigError

log = structlog.get_logger("egress.provider.upstream")

SESSION_LABEL = "egress-proxies/upstream-session"
COUNTRY_LABEL = "egress-proxies/upstream-country"
_SESSION_ALPHABET = string.ascii_lowercase + string.digits
_FIXES = {
    "Permanent": "fix the entry's account, password or template, or allowedCountries",
    "QuotaExceeded": "top up the account or raise its traffic limit at the service",
    "Transient": "check that this host reaches the gateway (endpoint), then try again",
}


@dataclass(frozen=True, slots=True)
class Metered:
    """One instance whose access log the meter reads: ``log_dir`` holds it (``ACCESS_LOG``, and
    the meter's rotated copy), ``pid`` is its Squid's (0 when none runs)."""

    name: str
    instance_uid: str
    proxy_uid: str
    instance_dir: Path
    log_dir: Path
    pid: int


def mint_session(length: int) -> str:
    """A fresh session id: ``length`` characters of a-z and 0-9, which every service takes."""
    return "".join(secrets.choice(_SESSION_ALPHABET) for _ in range(length))


class UpstreamProvider(LocalProvider):
    """A ``Provider`` whose instances are sessions of a proxy service; see the module
    docstring. Built on the local provider (always its Squid backend). ``targets``: what its
    Squids may reach beside public addresses (D134); none from the config, where the service is
    the egress and loopback sites are the tests' own."""

    type = "upstream"

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        endpoint: tuple[str, int],
        templates: Templates,
        password: str,
        allowed_countries: tuple[str, ...],
        account: str = "",
        zone: str = "",
        session_seconds: int = 600,
        probe_target: str = "example.com:443",
        probe_timeout: float = 20.0,
        port_range: tuple[int, int] = (20000, 29999),
        stop_grace: float = 3.0,
        start_grace: float = 10.0,
        max_bytes_per_day: int = 0,
        targets: tuple[AllowedTarget, ...] = (),
    ) -> None:
        if shutil.which(proc.SQUID) is None:
            raise ConfigError(
                f"provider {name!r}: upstream chains each session through a Squid, and `squid` "
                "is not on PATH; install Squid where the executor runs"
            )
        super().__init__(
            name,
            data_dir,
            backend=proc.SQUID,
            port_range=port_range,
            stop_grace=stop_grace,
            start_grace=start_grace,
            targets=targets,
        )
        if not allowed_countries:
            raise ConfigError(f"provider {name!r}: upstream.allowedCountries is empty")
        self.endpoint = endpoint
        self.templates = templates
        self.account = account
        self.zone = zone
        self.session_seconds = session_seconds
        self.allowed_countries = allowed_countries
        self.probe_target = probe_target
        self.probe_timeout = probe_timeout
        self.max_bytes_per_day = min(max(max_bytes_per_day, 0), MAX_BYTES)
        """Written into each meter record (0: none); a record holds at most ``MAX_BYTES``."""
        self._password = password

    def __repr__(self) -> str:
        return f"UpstreamProvider({self.name!r}, endpoint={self.endpoint[0]}:{self.endpoint[1]})"

    @classmethod
    def from_config(cls, name: str, config: UpstreamConfig) -> UpstreamProvider:  # type: ignore[override]  # another settings block than the local provider's
        if not config.data_dir:
            raise ConfigError(f"provider {name!r}: upstream.dataDir is required")
        return cls(
            name,
            Path(config.data_dir),
            endpoint=config.host_port,
            templates=config.templates,
            password=read_password(config, name),
            allowed_countries=config.allowed_countries,
            account=config.account,
            zone=config.zone,
            session_seconds=config.session_seconds,
            probe_target=config.probe_target,
            port_range=parse_port_range(config.port_range),
            stop_grace=config.stop_grace_seconds,
            max_bytes_per_day=config.max_bytes_per_day or 0,
        )

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        # Refused before anything is recorded: a wrong country or a missing attribute is the
        # spec's mistake, and would be the same on every retry.
        self._login(self._values(request, "0" * self.templates.session_length))
        return await super().create(request)

    async def preflight(self) -> list[Finding]:
        """Whether the service takes this entry's login: one ``CONNECT`` to ``probeTarget``
        per allowed country, each with a fresh session, answered by the gateway and mapped by
        ``pure.refusals`` (what an operator sees on each refusal: docs/providers.md)."""
        host, port = self.endpoint
        findings = []
        for country in self.allowed_countries:
            probe_request = CreateRequest(
                name="preflight",
                owner_uid="",
                namespace="",
                proxy_name="",
                spec=ProxySpec(attributes={"country": country}),
            )
            values = self._values(probe_request, mint_session(self.templates.session_length))
            username, password = self._login(values)
            answer = await probe.ask(
                host, port, username, password, self.probe_target, timeout=self.probe_timeout
            )
            error = refusal(answer, entry=self.name, now=datetime.now(UTC))
            check = f"login for {country}"
            if error is None:
                detail = f"{host}:{port} let a session in {country} CONNECT to {self.probe_target}"
                findings.append(Finding(check, True, detail))
            else:
                fix = _FIXES.get(type(error).__name__, "see the detail")
                findings.append(Finding(check, False, f"{type(error).__name__}: {error}", fix))
        return findings

    def metered(self) -> list[Metered]:
        """Every recorded instance and where its access log is; blocking (reads the records)."""
        return [
            Metered(
                name=found.meta.name,
                instance_uid=found.meta.instance_uid,
                proxy_uid=found.meta.owner_uid,
                instance_dir=found.path,
                log_dir=proc.log_dir(found.path),
                pid=self._pid(found.path),
            )
            for found in self._scan()
        ]

    # ---------------------------------------------------------------- hooks

    def _new_extra(self, request: CreateRequest) -> dict[str, str]:
        values = self._values(request, mint_session(self.templates.session_length))
        extra = {"session": values.session, "country": values.country}
        if values.city:
            extra["city"] = values.city
        if values.asn:
            extra["asn"] = values.asn
        log.info(
            "session minted",
            provider=self.name,
            name=request.name,
            session=values.session,
            country=values.country,
        )
        return extra

    def _prepare(self, path: Path, meta: InstanceMeta, request: CreateRequest) -> list[str]:
        extra = meta.extra
        values = Values(
            account=self.account,
            zone=self.zone,
            session=extra.get("session", ""),
            country=extra.get("country", ""),
            seconds=self.session_seconds,
            password=self._password,
            city=extra.get("city", ""),
            asn=extra.get("asn", ""),
        )
        username, password = self._login(values)
        host, port = self.endpoint
        return proc.prepare(
            meta.backend,
            path,
            meta.port,
            meta.name,
            lease_auth=request.lease_auth,
            parent=Parent(host, port, username, password),
            targets=self.targets,
            metered=True,
        )

    def _extra_labels(self, meta: InstanceMeta) -> dict[str, str]:
        labels = {}
        if "session" in meta.extra:
            labels[SESSION_LABEL] = meta.extra["session"]
        if "country" in meta.extra:
            labels[COUNTRY_LABEL] = meta.extra["country"]
        return labels

    # ---------------------------------------------------------------- internals

    def _country(self, request: CreateRequest) -> str:
        """The proxy's ``country`` attribute, else the country its egress must have, else the
        entry's first allowed country; one the entry does not allow is Permanent."""
        spec = request.spec
        wanted = spec.attributes.get("country", "") or spec.egress_rules.expect.country
        country = wanted.strip().lower() if wanted else self.allowed_countries[0]
        if country not in self.allowed_countries:
            raise Permanent(
                f"{self.name}: country {wanted[:16]!r} is not in upstream.allowedCountries "
                f"({', '.join(self.allowed_countries)}); give the proxy one of those, or add it "
                "to the entry if the service's plan covers it"
            )
        return country

    def _values(self, request: CreateRequest, session: str) -> Values:
        attributes = request.spec.attributes
        return Values(
            account=self.account,
            zone=self.zone,
            session=session,
            country=self._country(request),
            seconds=self.session_seconds,
            password=self._password,
            city=attributes.get("city", "") if "city" in self.templates.placeholders else "",
            asn=attributes.get("asn", "") if "asn" in self.templates.placeholders else "",
        )

    def _login(self, values: Values) -> tuple[str, str]:
        try:
            return render(self.templates, values)
        except TemplateError as exc:
            needs = sorted(FROM_ATTRIBUTES & self.templates.placeholders)
            hint = (
                f" (the template uses {', '.join(needs)} from the proxy's attributes)"
                if needs
                else ""
            )
            raise Permanent(f"{self.name}: cannot make the session's login: {exc}{hint}") from None
