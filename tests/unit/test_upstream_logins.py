"""The fake proxy service reads each service's user name as that service documents it
(services/testing/upstream_logins.py): what a login asks for, and every login it must refuse,
with a reason that never repeats the password."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from services.testing.upstream_logins import GRAMMARS, Login, LoginError, grammar

PASSWORD = "s3cr_et-pw"


def parse(name: str, user: str, password: str = PASSWORD, **templates: str) -> Login:
    return grammar(name, **templates).parse(user, password)


@pytest.mark.parametrize(
    ("name", "user", "password", "expected"),
    [
        (
            "brightdata",
            "brd-customer-hl_1a2b-zone-resi_de-country-de-session-ab12cd34",
            PASSWORD,
            Login("hl_1a2b", PASSWORD, "ab12cd34", "de", zone="resi_de"),
        ),
        (
            "brightdata",
            "brd-customer-acme-zone-z1-country-fr-city-paris-asn-3215-session-x9",
            PASSWORD,
            Login("acme", PASSWORD, "x9", "fr", zone="z1", city="paris", asn="3215"),
        ),
        (
            "oxylabs",
            "customer-acme-cc-DE-sessid-ab12cd34-sesstime-30",
            PASSWORD,
            Login("acme", PASSWORD, "ab12cd34", "de", seconds=1800),
        ),
        ("oxylabs", "customer-acme-cc-fr", PASSWORD, Login("acme", PASSWORD, "", "fr")),
        (
            "decodo",
            "user-acme-country-de-session-ab12cd34-sessionduration-30",
            PASSWORD,
            Login("acme", PASSWORD, "ab12cd34", "de", seconds=1800),
        ),
        (
            "iproyal",
            "acme",
            PASSWORD + "_country-de_session-ab12cd34_lifetime-30m",
            Login("acme", PASSWORD, "ab12cd34", "de", seconds=1800),
        ),
        (
            "iproyal",
            "acme",
            PASSWORD + "_session-ab12cd34_lifetime-2h_country-fr",
            Login("acme", PASSWORD, "ab12cd34", "fr", seconds=7200),
        ),
        ("iproyal", "acme", PASSWORD, Login("acme", PASSWORD)),
    ],
)
def test_each_service_s_login_is_read_as_it_documents(
    name: str, user: str, password: str, expected: Login
) -> None:
    assert parse(name, user, password) == expected


@pytest.mark.parametrize(
    ("name", "user", "password", "why"),
    [
        ("brightdata", "customer-acme-zone-z-session-a1", PASSWORD, "starts with brd-customer"),
        ("brightdata", "brd-customer-acme-country-de-session-a1", PASSWORD, "zone second"),
        ("brightdata", "brd-customer-acme-zone-z-session-a-1", PASSWORD, "key-value"),
        ("brightdata", "brd-customer-acme-zone-z-country-DE-session-a1", PASSWORD, "country"),
        ("brightdata", "brd-customer-acme-zone-z-session-a_1", PASSWORD, "session"),
        ("brightdata", "brd-customer-acme-zone-z-sessid-a1", PASSWORD, "no option 'sessid'"),
        ("oxylabs", "customer-acme-cc-de-sessid-a1-sessid-b2", PASSWORD, "given twice"),
        ("oxylabs", "customer-acme-cc-de-sessid-a1-sesstime-0", PASSWORD, "1 to 1440"),
        ("oxylabs", "customer-acme-cc-de-sessid-a1-sesstime-1441", PASSWORD, "1 to 1440"),
        ("oxylabs", "customer-acme-cc-de-sesstime-10", PASSWORD, "only with sessid"),
        ("oxylabs", "user-acme-cc-de", PASSWORD, "starts with customer"),
        ("oxylabs", "customer-acme-cc-deu", PASSWORD, "country"),
        ("oxylabs", "customer-acme-cc-", PASSWORD, "empty value"),
        ("decodo", "user-acme-country-de-session-a1-sessionduration-x", PASSWORD, "minutes"),
        ("decodo", "customer-acme-country-de", PASSWORD, "starts with user"),
        ("iproyal", "acme", PASSWORD + "_session-abc", "session"),
        ("iproyal", "acme", PASSWORD + "_session-ab12cd34_lifetime-30", "lifetime"),
        ("iproyal", "acme", PASSWORD + "_session-ab12cd34_lifetime-8d", "lifetime"),
        ("iproyal", "acme", PASSWORD + "_lifetime-10m", "only with _session-"),
        ("iproyal", "acme", PASSWORD + "_country-DE", "country"),
        ("iproyal", "a:b", PASSWORD, "account"),
    ],
)
def test_a_login_the_service_would_refuse_does_not_parse(
    name: str, user: str, password: str, why: str
) -> None:
    with pytest.raises(LoginError, match=why) as refused:
        parse(name, user, password)
    assert PASSWORD not in str(refused.value)


GENERIC = {
    "user_template": "acct.{account}.c.{COUNTRY}.s.{session}.t.{minutes}",
    "password_template": "{password}",
}


def test_the_generic_grammar_reads_its_template() -> None:
    login = parse("generic", "acct.acme.c.DE.s.ab12cd34.t.5", **GENERIC)
    assert login == Login("acme", PASSWORD, "ab12cd34", "de", seconds=300)
    with_password = grammar(
        "generic", user_template="{account}", password_template="{password}~{session}"
    )
    assert with_password.parse("acme", "pw~ab12") == Login("acme", "pw", "ab12")
    regex = grammar("generic", regex=r"(?P<account>\w+)/(?P<country>[a-z]{2})/(?P<session>\w+)")
    assert regex.parse("acme/fr/s1", "pw") == Login("acme", "pw", "s1", "fr")


@pytest.mark.parametrize(
    "user",
    ["acct.acme.c.de.s.a1.t.5", "acct.acme.c.DE.s.a-1.t.5", "acct.acme.c.DE.s.a1", "x" * 2000],
)
def test_a_login_off_the_generic_template_does_not_parse(user: str) -> None:
    with pytest.raises(LoginError, match="does not match"):
        parse("generic", user, **GENERIC)


@pytest.mark.parametrize(
    ("templates", "why"),
    [
        ({"user_template": "{account}-{sesion}"}, "sesion"),
        ({"user_template": "{account}-{country}"}, "need \\{session\\}"),
        ({"user_template": "{session}"}, "needs \\{account\\}"),
        ({"user_template": "{account}{session}{session}"}, "twice"),
        ({"user_template": "{account}-{session}", "password_template": "x"}, "\\{password\\}"),
        ({"regex": "(?P<account>a)(?P<other>b)(?P<session>c)"}, "other"),
        ({"regex": "(unclosed"}, "compile"),
        ({}, "one of them"),
        ({"user_template": "{account}-{session}", "regex": "(?P<account>.)"}, "one of them"),
    ],
)
def test_a_generic_grammar_that_cannot_work_is_refused_at_start(
    templates: dict[str, str], why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        grammar("generic", **templates)


def test_an_unknown_grammar_is_refused() -> None:
    with pytest.raises(ValueError, match="brightdata"):
        grammar("luminati")


TEXT = st.text(st.characters(codec="utf-8"), max_size=120)
SECRET = st.text("XYZ!#%", min_size=6, max_size=20)
OPTIONS = st.lists(
    st.tuples(st.sampled_from(["country", "session", "lifetime", "city", "x", ""]), TEXT),
    max_size=4,
).map(lambda pairs: "".join(f"_{key}-{value}" for key, value in pairs))


@settings(max_examples=400)
@given(name=st.sampled_from(GRAMMARS[:-1]), user=TEXT, secret=SECRET, options=OPTIONS | TEXT)
def test_any_login_is_read_or_refused_with_a_reason_never_a_crash(
    name: str, user: str, secret: str, options: str
) -> None:
    assume(secret not in user + options)
    try:
        login = parse(name, user, secret + options)
    except LoginError as exc:
        refused = str(exc)
    else:
        refused = ""
        assert login.password.startswith(secret)
    assert secret not in refused
    if refused:
        return
    assert login.session == "" or login.session.isalnum()
    assert login.country == "" or (len(login.country) == 2 and login.country.islower())
