"""The user names and passwords of proxy services: their grammars as templates, checked at
start-up and rendered per session (docs/decisions/0160-upstream-proxy-services.md).

A proxy service pins an exit to a session named in the credentials a request carries: the user
name (``...-country-de-session-k3x9...``) or, for some, the password. Each named template writes
one service's public grammar; ``generic`` takes an entry's own. A template is checked once, when
the config is read: an unknown placeholder, a conversion or format spec (``{session!r}``), a
literal that no proxy login may carry (``:`` in a user name, spaces, control characters), or a
pair of templates without ``{session}`` is refused naming the field, since every request of
every proxy of the entry would fail later, far from the mistake.

Values are checked when rendered: a value holding one of the template's own separators (a ``-``
in a zone of a ``-``-separated user name, a ``_`` in a country of IPRoyal's password) would
shift every field after it, and the service would read another account, country or session.
The account's password is the one value not checked against separators: it is the service's
own secret, put first where a service takes it, and may hold anything but a control character.
Pure: the session id and the password are handed in.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

NAMED_TEMPLATES = ("brightdata", "oxylabs", "decodo", "iproyal")
GENERIC = "generic"
TEMPLATE_NAMES = (*NAMED_TEMPLATES, GENERIC)

USER_PLACEHOLDERS = frozenset(
    {"account", "zone", "session", "country", "COUNTRY", "city", "asn", "minutes"}
)
PASSWORD_PLACEHOLDERS = USER_PLACEHOLDERS | {"password"}
FROM_ATTRIBUTES = frozenset({"city", "asn"})
"""Placeholders a proxy's ``attributes`` fill; the others come from the entry or are minted."""

MAX_TEMPLATE = 256
MAX_VALUE = 128
MAX_PASSWORD = 512
SESSION = re.compile(r"^[a-z0-9]{8,16}\Z")
COUNTRY = re.compile(r"^[a-z]{2}\Z")
_VALUE = re.compile(r"^[A-Za-z0-9._-]+\Z")
"""What a value may hold at all; a separator among ``._-`` is then refused where the template
uses it as one."""
_SEPARATORS = "-_."
_LITERAL_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")


class TemplateError(ValueError):
    """A template or a value that would not make a login the service reads as meant; the
    message names the field or the placeholder, never the password."""


@dataclass(frozen=True, slots=True)
class Templates:
    """A service's user name and password templates, checked (``checked``); ``session_length``
    is the length of the session ids minted for it."""

    username: str
    password: str = "{password}"
    session_length: int = 16

    @property
    def placeholders(self) -> frozenset[str]:
        return _fields(self.username) | _fields(self.password)


NAMED: dict[str, Templates] = {
    # Bright Data: the zone's credentials, targeting and session as dash-separated pairs.
    "brightdata": Templates(
        "brd-customer-{account}-zone-{zone}-country-{country}-session-{session}"
    ),
    # Oxylabs: the country code upper case, the session's time in minutes.
    "oxylabs": Templates("customer-{account}-cc-{COUNTRY}-sessid-{session}-sesstime-{minutes}"),
    # Decodo (formerly Smartproxy): sessionduration in minutes, 1 to 1440.
    "decodo": Templates(
        "user-{account}-country-{country}-session-{session}-sessionduration-{minutes}"
    ),
    # IPRoyal: targeting goes in the password; session keys are eight characters.
    "iproyal": Templates(
        "{account}",
        "{password}_country-{country}_session-{session}_lifetime-{minutes}m",
        session_length=8,
    ),
}


@dataclass(frozen=True, slots=True)
class Values:
    """What one session's login is made of. ``seconds`` is the entry's ``sessionSeconds``;
    ``city`` and ``asn`` come from the proxy's attributes, empty when it has none."""

    account: str
    zone: str
    session: str
    country: str
    seconds: int
    password: str = field(repr=False)
    city: str = ""
    asn: str = ""

    def get(self, name: str) -> str:
        if name == "COUNTRY":
            return self.country.upper()
        if name == "minutes":
            return str(max(1, self.seconds // 60))
        return str(getattr(self, name))


def _fields(template: str) -> frozenset[str]:
    return frozenset(
        name for _, name, _, _ in string.Formatter().parse(template) if name is not None
    )


def template_problem(template: str, field_name: str, *, password: bool) -> str:
    """The first problem with one template, naming ``field_name``; ``""`` if none."""
    allowed = PASSWORD_PLACEHOLDERS if password else USER_PLACEHOLDERS
    shown = ", ".join(f"{{{p}}}" for p in sorted(allowed, key=str.lower))
    if not template:
        return f"{field_name} is empty; write the service's grammar with placeholders ({shown})"
    if len(template) > MAX_TEMPLATE:
        return f"{field_name} is longer than {MAX_TEMPLATE} characters; no service's grammar is"
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"{field_name}: unbalanced braces ({exc}); write placeholders as {{session}}"
    for literal, name, spec, conversion in parsed:
        bad = _LITERAL_FORBIDDEN.search(literal)
        if bad:
            return (
                f"{field_name}: the character {bad.group()!r} cannot be part of a proxy login; "
                "remove it"
            )
        if not password and ":" in literal:
            return f"{field_name}: ':' ends a user name in a proxy login; remove it"
        if name is None:
            continue
        if name not in allowed:
            what = "a positional {}" if name == "" else f"{{{name}}}"
            return f"{field_name}: {what} is not a placeholder; use {shown}"
        if spec or conversion:
            return (
                f"{field_name}: {{{name}}} carries a conversion or format spec; write it as "
                f"{{{name}}} alone"
            )
    if not password and template.startswith("*"):
        return f"{field_name}: a user name starting with '*' means another login to Squid"
    return ""


def checked(username: str, password: str = "{password}", *, where: str = "") -> Templates:
    """The pair of templates, or TemplateError naming the field: both valid, and ``{session}``
    in one of them (a login without it would share one exit among every proxy)."""
    prefix = f"{where}." if where else ""
    problem = template_problem(username, f"{prefix}username", password=False) or template_problem(
        password, f"{prefix}password", password=True
    )
    if problem:
        raise TemplateError(problem)
    templates = Templates(username, password)
    if "session" not in templates.placeholders:
        raise TemplateError(
            f"{prefix}username has no {{session}} (nor has {prefix}password): every proxy "
            "would share one exit; put {session} where the service reads its session id"
        )
    return templates


def named(name: str) -> Templates:
    """A named service's templates; KeyError for a name not in ``NAMED``."""
    return NAMED[name]


def _value_problem(name: str, value: str, separators: str) -> str:
    if name == "password":
        if not value:
            return "the account's password is empty"
        if len(value) > MAX_PASSWORD or _LITERAL_FORBIDDEN.search(value.replace(" ", "x")):
            return "the account's password holds a control character or is too long (not shown)"
        return ""
    if name == "country" and not COUNTRY.match(value):
        return f"country {value[:32]!r} is not an ISO 3166-1 alpha-2 code in lower case, e.g. de"
    if name == "session" and not SESSION.match(value):
        return f"session id {value[:32]!r} is not 8 to 16 characters of a-z and 0-9"
    if not value:
        hint = " (give the proxy the attribute)" if name in FROM_ATTRIBUTES else ""
        return f"{{{name}}} is empty{hint}"
    if len(value) > MAX_VALUE or not _VALUE.match(value):
        return (
            f"{{{name}}} value {value[:32]!r} holds characters a login cannot carry; "
            "use letters, digits, '.', '_' or '-'"
        )
    clash = next((c for c in separators if c in value), "")
    if clash:
        return (
            f"{{{name}}} value {value[:32]!r} holds {clash!r}, which separates the fields of "
            "this login: the service would read the fields after it wrongly"
        )
    return ""


def _render(template: str, values: Values) -> str:
    separators = "".join(
        c for c in _SEPARATORS if any(c in lit for lit, *_ in string.Formatter().parse(template))
    )
    out: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        value = values.get(name)
        # {COUNTRY} is checked as the country it is made of.
        checked_as = ("country", values.country) if name == "COUNTRY" else (name, value)
        problem = _value_problem(*checked_as, separators)
        if problem:
            raise TemplateError(problem)
        out.append(value)
    return "".join(out)


def render(templates: Templates, values: Values) -> tuple[str, str]:
    """The user name and the password of one session's login, or TemplateError naming the
    placeholder whose value would break it (never showing the password)."""
    return _render(templates.username, values), _render(templates.password, values)
