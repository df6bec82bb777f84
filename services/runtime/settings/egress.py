"""The settings that judge a proxy's egress, shared by the health service (which replaces a
proxy that does not match) and discovery (which does not lease it): one set of options, so
``up`` gives both the same values and ``run NAME`` takes the same flags
(docs/decisions/0111-verified-egress.md).
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from projections.egress import EgressPolicy
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import setting

_ATTRIBUTE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?\Z")


def policy_from(
    egress_country_attribute: str = "", egress_required: bool = False, unique_egress: bool = False
) -> EgressPolicy:
    """The policy the flags describe; a country attribute no proxy could carry fails here."""
    if egress_country_attribute and not _ATTRIBUTE.match(egress_country_attribute):
        raise ConfigError(
            f"--egress-country-attribute {egress_country_attribute!r}: name an attribute key "
            "(1-63 letters, digits, '.', '_', '/' or '-'), e.g. country"
        )
    return EgressPolicy(
        country_attribute=egress_country_attribute,
        required=egress_required,
        unique=unique_egress,
    )


class PolicySettings(msgspec.Struct, frozen=True, kw_only=True):
    """The flags of the policy, part of the health's and discovery's settings (and ``get``'s)."""

    egress_country_attribute: Annotated[
        str,
        setting(
            "Hold each proxy's egress to the country its own attribute KEY names (e.g. "
            "country: de); spec.egress.expect.country wins. Empty: only spec.egress.expect.",
            metavar="KEY",
            show_default=False,
        ),
    ] = ""
    egress_required: Annotated[
        bool,
        setting(
            "Lease a proxy only once its egress has been checked (otherwise a proxy not checked "
            "yet is leased unless it states an expectation).",
            show_default=False,
        ),
    ] = False
    unique_egress: Annotated[
        bool,
        setting(
            "Of two proxies that leave through one public address, do not lease the one that "
            "had it later, until the clash ends (both are flagged either way).",
            show_default=False,
        ),
    ] = False

    def policy(self) -> EgressPolicy:
        return policy_from(self.egress_country_attribute, self.egress_required, self.unique_egress)
