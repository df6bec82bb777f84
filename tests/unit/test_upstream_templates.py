"""The proxy services' login grammars (D160): each named template renders the service's public
grammar, a template is checked naming its field, and a value that would shift the service's
reading of the login is refused, whatever it holds."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.providers.upstream.pure.templates import (
    NAMED,
    TemplateError,
    Values,
    checked,
    render,
    template_problem,
)

PASSWORD = "Pa55_w-rd:x"


def values(**changes: object) -> Values:
    base: dict[str, object] = {
        "account": "acme",
        "zone": "resi1",
        "session": "k3x9abcd0001",
        "country": "de",
        "seconds": 1800,
        "password": PASSWORD,
    }
    base.update(changes)
    return Values(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "user", "password"),
    [
        (
            "brightdata",
            "brd-customer-acme-zone-resi1-country-de-session-k3x9abcd0001",
            PASSWORD,
        ),
        ("oxylabs", "customer-acme-cc-DE-sessid-k3x9abcd0001-sesstime-30", PASSWORD),
        (
            "decodo",
            "user-acme-country-de-session-k3x9abcd0001-sessionduration-30",
            PASSWORD,
        ),
        (
            "iproyal",
            "acme",
            f"{PASSWORD}_country-de_session-k3x9abcd0001_lifetime-30m",
        ),
    ],
)
def test_each_service_gets_its_grammar(template: str, user: str, password: str) -> None:
    assert render(NAMED[template], values()) == (user, password)


@pytest.mark.parametrize(
    ("seconds", "minutes"), [(60, "1"), (59, "1"), (119, "1"), (86400, "1440")]
)
def test_minutes_are_whole_and_at_least_one(seconds: int, minutes: str) -> None:
    user, _ = render(NAMED["oxylabs"], values(seconds=seconds))
    assert user.endswith(f"-sesstime-{minutes}")


def test_a_bright_data_account_keeps_its_underscore() -> None:
    """Bright Data's customer ids are written ``hl_...``: '_' separates nothing there."""
    user, _ = render(NAMED["brightdata"], values(account="hl_1a2b3c4d"))
    assert user.startswith("brd-customer-hl_1a2b3c4d-zone-")


def test_every_named_template_is_valid_and_has_a_session() -> None:
    for name, templates in NAMED.items():
        assert checked(templates.username, templates.password).placeholders == (
            templates.placeholders
        ), name
        assert "session" in templates.placeholders


def test_a_generic_template_with_its_placeholders() -> None:
    templates = checked("u-{account}-{COUNTRY}-city-{city}-asn-{asn}", "{password}-{session}")
    user, password = render(templates, values(city="berlin", asn="3320"))
    assert user == "u-acme-DE-city-berlin-asn-3320"
    assert password == f"{PASSWORD}-k3x9abcd0001"


@pytest.mark.parametrize(
    ("username", "password", "says"),
    [
        ("customer-{account}-country-{country}", "{password}", r"username has no \{session\}"),
        ("customer-{acount}-session-{session}", "{password}", r"username: \{acount\} is not a"),
        ("u-{}-{session}", "{password}", r"username: a positional \{\} is not a placeholder"),
        ("u-{session!r}", "{password}", r"username: \{session\} carries a conversion"),
        ("u-{session:>20}", "{password}", r"username: \{session\} carries a conversion"),
        ("u-{session.real}", "{password}", r"username: \{session.real\} is not a"),
        ("u-{session[0]}", "{password}", r"is not a placeholder"),
        ("u-{session", "{password}", r"username: unbalanced braces"),
        ("u}-{session}", "{password}", r"username: unbalanced braces"),
        ("u-{password}-{session}", "{password}", r"username: \{password\} is not a"),
        ("u:{session}", "{password}", r"username: ':' ends a user name"),
        ("u {session}", "{password}", r"username: the character ' '"),
        ("u-{session}", "{password}\n", r"password: the character '\\n'"),
        ("u-{session}\r\nX-Evil: 1", "{password}", r"username: the character '\\r'"),
        ("*-{session}", "{password}", r"username: a user name starting with '\*'"),
        ("", "{password}", r"username is empty"),
        ("u-{session}", "", r"password is empty"),
        ("u-{session}" * 40, "{password}", r"longer than 256"),
        (
            "u-{country}",
            "{password}_{zone}",
            r"username has no \{session\} \(nor has \S+password\)",
        ),
        ("u-{country}", "{password}-{sesion}", r"password: \{sesion\} is not a placeholder"),
    ],
)
def test_a_broken_template_is_refused_naming_the_field(
    username: str, password: str, says: str
) -> None:
    with pytest.raises(TemplateError, match=says):
        checked(username, password, where="providers[0].upstream")
    with pytest.raises(TemplateError, match="providers\\[0\\]\\.upstream\\."):
        checked(username, password, where="providers[0].upstream")


def test_the_session_may_be_in_the_password_alone() -> None:
    assert checked("{account}", "{password}_session-{session}").username == "{account}"


def test_template_problem_is_empty_for_a_good_one() -> None:
    assert template_problem("a-{session}", "username", password=False) == ""


@pytest.mark.parametrize(
    ("template", "change", "says"),
    [
        ("brightdata", {"zone": "res-1"}, r"\{zone\} value 'res-1' holds '-'"),
        ("brightdata", {"account": "ac:me"}, r"characters a login cannot carry"),
        ("brightdata", {"account": "ac@me"}, r"characters a login cannot carry"),
        ("brightdata", {"account": ""}, r"\{account\} is empty"),
        ("brightdata", {"zone": ""}, r"\{zone\} is empty"),
        ("oxylabs", {"country": ""}, r"country '' is not an ISO 3166-1"),
        ("oxylabs", {"country": "deu"}, r"country 'deu' is not"),
        ("decodo", {"country": "d-"}, r"country 'd-' is not"),
        ("iproyal", {"country": "d_"}, r"country 'd_' is not"),
        ("decodo", {"session": "ABCDEFGH"}, r"session id 'ABCDEFGH' is not 8 to 16"),
        ("decodo", {"session": "abc"}, r"session id 'abc' is not 8 to 16"),
        ("decodo", {"session": "a" * 17}, r"is not 8 to 16"),
        ("iproyal", {"password": ""}, r"the account's password is empty"),
        ("iproyal", {"password": "a\nb"}, r"control character"),
    ],
)
def test_a_value_that_breaks_the_login_is_refused(
    template: str, change: dict[str, object], says: str
) -> None:
    with pytest.raises(TemplateError, match=says) as caught:
        render(NAMED[template], values(**change))
    assert PASSWORD not in str(caught.value)


def test_an_underscore_breaks_iproyals_password_but_not_a_dash_grammar() -> None:
    templates = checked("{account}-{zone}-{session}", "{password}_z-{zone}")
    with pytest.raises(TemplateError, match=r"\{zone\} value 'a_b' holds '_'"):
        render(templates, values(zone="a_b"))
    assert render(checked("{account}-{zone}-{session}"), values(zone="a_b"))[0] == (
        "acme-a_b-k3x9abcd0001"
    )


def test_a_missing_city_names_the_attribute() -> None:
    with pytest.raises(TemplateError, match=r"\{city\} is empty \(give the proxy the attribute\)"):
        render(checked("u-{city}-{session}"), values())


def test_the_password_is_not_in_the_values_repr() -> None:
    assert PASSWORD not in repr(values())


_ANY = st.text(st.characters(codec="utf-8"), max_size=40)


@given(account=_ANY, zone=_ANY, country=_ANY, city=_ANY)
def test_whatever_the_values_a_rendered_login_parses_back(
    account: str, zone: str, country: str, city: str
) -> None:
    """A login is either refused, or holds each value in its place: split at the grammar's
    separator, the fields are exactly the ones written, so the service reads what we meant."""
    templates = checked("c-{account}-z-{zone}-cc-{country}-city-{city}-s-{session}")
    given_values = values(account=account, zone=zone, country=country, city=city)
    try:
        user, password = render(templates, given_values)
    except TemplateError as exc:
        refused = str(exc)
        assert PASSWORD not in refused
        return
    assert password == PASSWORD
    assert re.fullmatch(r"[A-Za-z0-9._-]+", user)
    fields = user.split("-")
    assert fields == ["c", account, "z", zone, "cc", country, "city", city, "s", "k3x9abcd0001"]


@given(text=st.text(max_size=60))
def test_any_template_text_is_checked_or_refused_never_crashes(text: str) -> None:
    try:
        templates = checked(text)
    except TemplateError as exc:
        refused = str(exc)
        assert refused
        return
    assert "session" in templates.placeholders
