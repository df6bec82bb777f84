"""The test kit's one naming rule (D150): a module of ``services.testing`` is named after what
it stands in for, so a reader finds the Hetzner fake at ``services.testing.hetzner`` and its
answers at ``services.testing.hetzner_api`` without knowing who wrote which. Its docstring
lists what it offers, so a module it does not mention fails here too."""

from __future__ import annotations

import pkgutil
import re

import services.testing
from services.providers.config import PROVIDER_TYPES

IN_MEMORY = frozenset({"provider", "eventlog"})
"""The in-memory stand-ins, named after the port they fill (``type: fake`` is ``provider``)."""
SHARED = "cloud"
"""The prefix of what every cloud fake shares."""
PART = re.compile(r"^(?P<subject>[a-z]+)(?:_(?P<part>[a-z]+))?$")


SERVICES = frozenset({"upstream"})
"""The proxy services' fake, named after the provider type that leases from them (issue 39),
whether or not that type is registered yet."""


def clouds() -> set[str]:
    return (set(PROVIDER_TYPES) - {"fake"}) | SERVICES


def follows_rule(name: str) -> bool:
    """``provider``/``eventlog``; ``<type>`` or ``<type>_<part>`` for a provider type;
    ``cloud_<part>``; a part is one word."""
    if name in IN_MEMORY:
        return True
    found = PART.match(name)
    if found is None:
        return False
    if found["subject"] == SHARED:
        return found["part"] is not None
    return found["subject"] in clouds()


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(services.testing.__path__))


def test_every_module_follows_the_naming_rule() -> None:
    assert modules(), "the test kit has no module"
    broken = [name for name in modules() if not follows_rule(name)]
    assert not broken, f"named against the rule in services/testing/__init__.py: {broken}"


def test_the_rule_refuses_the_names_it_replaced() -> None:
    for old in ("testing", "fakehttp", "fakeapi", "fake_api", "fakecatalogue", "motoserver"):
        assert not follows_rule(old), old
    assert not follows_rule("hetzner_fake_api")
    assert not follows_rule("cloud")
    assert not follows_rule("nowhere")
    assert follows_rule("hetzner_api")
    assert follows_rule("cloud_http")
    assert follows_rule("upstream_logins")
    assert not follows_rule("upstream_fake_server")


def test_the_package_says_what_it_offers() -> None:
    doc = services.testing.__doc__ or ""
    unsaid = []
    for name in modules():
        found = PART.match(name)
        if f"``{name}``" in doc:
            continue
        # A part is listed once for every cloud: ``_api``, ``_catalogue``.
        subject, part = (found["subject"], found["part"]) if found else (name, None)
        if part and f"``_{part}``" in doc and f"``{subject}``" in doc:
            continue
        unsaid.append(name)
    assert not unsaid, f"services/testing/__init__.py does not say what these offer: {unsaid}"
    assert "never imports" in doc
