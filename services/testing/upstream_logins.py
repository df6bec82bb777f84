"""How the fake proxy service (``upstream_server``) reads a login: the user name grammars of the
services the ``upstream`` provider type leases from, each parsed as that service documents it.

Parsed independently of the provider's templates (services/providers/upstream), from the
services' public documentation, so that a test through the fake cross-checks what the provider
renders instead of repeating it:

- ``brightdata``: ``brd-customer-<id>-zone-<zone>`` then ``-key-value`` options: ``country``
  (lower case), ``city``, ``asn``, ``session`` (letters and digits only);
- ``oxylabs``: ``customer-<user>`` then ``cc`` (the country, any case), ``city``, ``st``,
  ``sessid`` (letters and digits), ``sesstime`` (minutes, 1 to 1440);
- ``decodo``: ``user-<user>`` then ``country`` (lower case), ``city``, ``state``, ``asn``,
  ``session``, ``sessionduration`` (minutes, 1 to 1440);
- ``iproyal``: the user name is the account alone; the password carries ``_key-value`` options
  after the account's password: ``country`` (lower case), ``city``, ``state``, ``session``
  (exactly 8 letters and digits), ``lifetime`` (one number and one unit of s, m, h or d,
  1 second to 7 days);
- ``generic``: a template of the provider's placeholders (``{account}``, ``{session}``,
  ``{country}``, ``{COUNTRY}``, ``{city}``, ``{asn}``, ``{zone}``, ``{minutes}``) for the user
  name and another for the password (``{password}`` by default), or a regular expression with
  groups of those names for the user name.

A key the grammar does not know, one given twice, a value the service would refuse: the login
does not parse (``LoginError``, answered 407 with the reason). The reason never repeats the
password, not even iproyal's options beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

GRAMMARS = ("brightdata", "oxylabs", "decodo", "iproyal", "generic")
PLACEHOLDERS = ("account", "zone", "session", "country", "COUNTRY", "city", "asn", "minutes")
MAX_MINUTES = 1440
MAX_IPROYAL_SECONDS = 7 * 24 * 3600
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SESSION = re.compile(r"[A-Za-z0-9]{1,64}")
IPROYAL_SESSION = re.compile(r"[A-Za-z0-9]{8}")
COUNTRY = re.compile(r"[a-z]{2}")
WORD = re.compile(r"[A-Za-z0-9_.]{1,100}")
NUMBER = re.compile(r"[0-9]{1,9}")
LIFETIME = re.compile(r"([0-9]{1,9})([smhd])")
MAX_LOGIN = 1024


class LoginError(ValueError):
    """A login the service cannot read; the message says why, without the password."""


@dataclass(frozen=True, slots=True)
class Login:
    """What a login asks for, as the service read it."""

    account: str
    password: str
    """The account's password, options taken off (iproyal's ride on it)."""
    session: str = ""
    country: str = ""
    """Lower case; empty: any country."""
    zone: str = ""
    city: str = ""
    asn: str = ""
    seconds: int | None = None
    """The session lifetime the login asks for (``sesstime``, ``lifetime``...), if any."""

    def fields(self) -> dict[str, object]:
        """What the control API shows of it: everything but the password."""
        return {
            "account": self.account,
            "zone": self.zone,
            "session": self.session,
            "country": self.country,
            "city": self.city,
            "asn": self.asn,
            "seconds": self.seconds,
        }


@dataclass(frozen=True, slots=True)
class Grammar:
    """One service's way of reading a login; ``parse(user, password)``."""

    name: str
    parse: Callable[[str, str], Login]


def grammar(
    name: str, *, user_template: str = "", password_template: str = "", regex: str = ""
) -> Grammar:
    """The grammar ``name``; ``generic`` needs ``user_template`` or ``regex`` (a ValueError
    says what is wrong with them)."""
    named = {"brightdata": _brightdata, "oxylabs": _oxylabs, "decodo": _decodo}
    if name in named:
        return Grammar(name, named[name])
    if name == "iproyal":
        return Grammar(name, _iproyal)
    if name == "generic":
        return Grammar(name, _generic(user_template, password_template or "{password}", regex))
    raise ValueError(f"grammar {name!r}: use one of {', '.join(GRAMMARS)}")


# ----------------------------------------------------------------------------- named services


def _pairs(text: str, separator: str, where: str) -> list[tuple[str, str]]:
    """``key-value`` pairs joined by ``separator`` (``a-1-b-2`` for ``-``; ``a-1_b-2`` for
    ``_``), each key once."""
    if separator == "-":
        parts = text.split("-")
        if len(parts) % 2:
            raise LoginError(f"{where} is not key-value pairs joined by '-': {_shown(text)}")
        pairs = list(zip(parts[::2], parts[1::2], strict=True))
    else:
        pairs = []
        for item in text.split(separator):
            key, sep, value = item.partition("-")
            if not sep:
                raise LoginError(f"{where}: the option {_shown(item)} has no '-<value>'")
            pairs.append((key, value))
    seen: set[str] = set()
    for key, value in pairs:
        if not value:
            raise LoginError(f"{where}: the option {_shown(key)} has an empty value")
        if key in seen:
            raise LoginError(f"{where}: the option {_shown(key)} is given twice")
        seen.add(key)
    return pairs


def _options(pairs: list[tuple[str, str]], known: dict[str, str], service: str) -> dict[str, str]:
    """The pairs by their meaning (``known``: the service's key -> ours)."""
    found: dict[str, str] = {}
    for key, value in pairs:
        if key not in known:
            accepted = ", ".join(sorted(known))
            raise LoginError(f"{service} has no option {_shown(key)} (it reads {accepted})")
        found[known[key]] = value
    return found


def _checked(found: dict[str, str], *, session: re.Pattern[str] = SESSION) -> dict[str, str]:
    for field, pattern in (("session", session), ("country", COUNTRY)):
        value = found.get(field)
        if value is not None and not pattern.fullmatch(value):
            raise LoginError(f"the {field} {_shown(value)} is not valid here")
    for field in ("city", "asn", "zone", "account"):
        value = found.get(field)
        if value is not None and not WORD.fullmatch(value):
            raise LoginError(f"the {field} {_shown(value)} is not valid here")
    return found


def _minutes(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    if not NUMBER.fullmatch(value) or not 1 <= int(value) <= MAX_MINUTES:
        raise LoginError(f"{key} is minutes from 1 to {MAX_MINUTES}, got {_shown(value)}")
    return int(value) * 60


def _login(found: dict[str, str], password: str, seconds: int | None) -> Login:
    return Login(
        account=found["account"],
        password=password,
        session=found.get("session", ""),
        country=found.get("country", ""),
        zone=found.get("zone", ""),
        city=found.get("city", ""),
        asn=found.get("asn", ""),
        seconds=seconds,
    )


def _leading(pairs: list[tuple[str, str]], key: str, service: str) -> None:
    if not pairs or pairs[0][0] != key:
        raise LoginError(f"a {service} user name starts with {key}-<account>")


def _brightdata(user: str, password: str) -> Login:
    if not user.startswith("brd-"):
        raise LoginError("a brightdata user name starts with brd-customer-<id>-zone-<zone>")
    pairs = _pairs(user.removeprefix("brd-"), "-", "the user name")
    _leading(pairs, "customer", "brightdata")
    if len(pairs) < 2 or pairs[1][0] != "zone":
        raise LoginError("a brightdata user name names its zone second: -zone-<zone>")
    known = {
        "customer": "account",
        "zone": "zone",
        "country": "country",
        "city": "city",
        "asn": "asn",
        "session": "session",
    }
    found = _checked(_options(pairs, known, "brightdata"))
    return _login(found, password, None)


def _oxylabs(user: str, password: str) -> Login:
    pairs = _pairs(user, "-", "the user name")
    _leading(pairs, "customer", "oxylabs")
    known = {
        "customer": "account",
        "cc": "country",
        "city": "city",
        "st": "state",
        "sessid": "session",
        "sesstime": "minutes",
    }
    found = _options(pairs, known, "oxylabs")
    if "country" in found:
        found["country"] = found["country"].lower()  # "case insensitive", says the service
    if "minutes" in found and "session" not in found:
        raise LoginError("oxylabs reads sesstime only with sessid")
    return _login(_checked(found), password, _minutes(found.get("minutes"), "sesstime"))


def _decodo(user: str, password: str) -> Login:
    pairs = _pairs(user, "-", "the user name")
    _leading(pairs, "user", "decodo")
    known = {
        "user": "account",
        "country": "country",
        "city": "city",
        "state": "state",
        "asn": "asn",
        "session": "session",
        "sessionduration": "minutes",
    }
    found = _checked(_options(pairs, known, "decodo"))
    return _login(found, password, _minutes(found.get("minutes"), "sessionduration"))


def _iproyal(user: str, password: str) -> Login:
    """The account's password is what precedes the first ``_<known option>-``: a password may
    hold ``_`` itself."""
    known = {
        "country": "country",
        "city": "city",
        "state": "state",
        "session": "session",
        "lifetime": "lifetime",
    }
    start = re.search("_(?:" + "|".join(known) + ")-", password)
    own, options = (
        (password, "")
        if start is None
        else (password[: start.start()], password[start.start() + 1 :])
    )
    found = (
        _options(_pairs(options, "_", "the password's options"), known, "iproyal")
        if options
        else {}
    )
    found["account"] = user
    found = _checked(found, session=IPROYAL_SESSION)
    seconds = None
    if "lifetime" in found:
        match = LIFETIME.fullmatch(found["lifetime"])
        seconds = int(match[1]) * UNITS[match[2]] if match else 0
        if not 1 <= seconds <= MAX_IPROYAL_SECONDS:
            raise LoginError(
                f"lifetime is one number and one unit (s, m, h, d), 1s to 7d, got "
                f"{_shown(found['lifetime'])}"
            )
    if "lifetime" in found and "session" not in found:
        raise LoginError("iproyal reads _lifetime- only with _session-")
    return _login(found, own, seconds)


# ----------------------------------------------------------------------------- generic


VALUE = r"[^\-_:@\s]+?"
"""What a placeholder matches: the provider refuses a value with one of ``-_:@``."""
GROUPS = {
    "account": rf"(?P<account>{VALUE})",
    "zone": rf"(?P<zone>{VALUE})",
    "session": rf"(?P<session>{VALUE})",
    "country": r"(?P<country>[a-z]{2})",
    "COUNTRY": r"(?P<COUNTRY>[A-Z]{2})",
    "city": rf"(?P<city>{VALUE})",
    "asn": r"(?P<asn>[0-9]+)",
    "minutes": r"(?P<minutes>[0-9]{1,9})",
    "password": r"(?P<password>.+?)",
}
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def template_pattern(template: str, *, allowed: tuple[str, ...]) -> re.Pattern[str]:
    """``template`` as an anchored pattern; a placeholder not in ``allowed``, or one used twice,
    is a ValueError."""
    parts: list[str] = []
    used: set[str] = set()
    last = 0
    for match in PLACEHOLDER.finditer(template):
        name = match[1]
        if name not in allowed:
            raise ValueError(f"the template {template!r} has {{{name}}}: use {', '.join(allowed)}")
        if name in used:
            raise ValueError(f"the template {template!r} has {{{name}}} twice")
        used.add(name)
        parts += [re.escape(template[last : match.start()]), GROUPS[name]]
        last = match.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts))


def _generic(user_template: str, password_template: str, regex: str) -> Callable[[str, str], Login]:
    if bool(user_template) == bool(regex):
        raise ValueError("the generic grammar needs a user name template or a regex, one of them")
    if regex:
        try:
            user_pattern = re.compile(regex)
        except re.error as exc:
            raise ValueError(f"the regex {regex!r} does not compile: {exc}") from None
        unknown = set(user_pattern.groupindex) - set(PLACEHOLDERS)
        if unknown:
            raise ValueError(f"the regex names groups {sorted(unknown)}: use {PLACEHOLDERS}")
        if "account" not in user_pattern.groupindex:
            raise ValueError("the regex needs an (?P<account>...) group")
    else:
        user_pattern = template_pattern(user_template, allowed=PLACEHOLDERS)
        if "account" not in user_pattern.groupindex:
            raise ValueError("the user name template needs {account}")
    password_pattern = template_pattern(password_template, allowed=(*PLACEHOLDERS, "password"))
    if "password" not in password_pattern.groupindex:
        raise ValueError("the password template needs {password}")
    if "session" not in {*user_pattern.groupindex, *password_pattern.groupindex}:
        raise ValueError("the templates need {session}, in the user name or the password")

    def parse(user: str, password: str) -> Login:
        found: dict[str, str] = {}
        for pattern, text, where in (
            (user_pattern, user, "the user name"),
            (password_pattern, password, "the password"),
        ):
            match = pattern.fullmatch(text)
            if match is None:
                shown = _shown(text) if where == "the user name" else "(not shown)"
                raise LoginError(f"{where} does not match the service's template: {shown}")
            for name, value in match.groupdict().items():
                if value is not None:
                    found[name] = value
        if "COUNTRY" in found:
            found["country"] = found.pop("COUNTRY").lower()
        own = found.pop("password")
        return _login(_checked(found), own, _minutes(found.get("minutes"), "{minutes}"))

    return parse


def _shown(text: str) -> str:
    """A piece of a login in a reason: printable, short."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text[:80])
    return repr(cleaned + ("..." if len(text) > 80 else ""))
