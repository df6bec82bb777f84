"""The error a bad setting raises, apart from the code that reads settings.

Pure modules (a provider's config block, duration parsing) report bad values with it; importing
it from the module that reads the environment would pull ``os`` into them and out of reach of the
purity contract in pyproject.toml.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag, the variable and the fix."""
