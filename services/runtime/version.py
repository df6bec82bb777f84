"""The product's version, the one number `--version`, the OpenAPI document and `up`'s banner show.

It is written once, in pyproject.toml (``[project] version``), and read back here from the
installed distribution's metadata, so a wheel, an sdist and an editable install all report the
number they were built with; no second copy can drift. The client library (clients/python) is
released with the same number; tests/unit/test_version.py checks both agree (docs/decisions/,
D100). Pure: reading the metadata has no effect and gives the same answer for a process's life.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "egress-proxies"

try:
    VERSION: str = version(DISTRIBUTION)
except PackageNotFoundError as exc:
    # Without metadata there is no true number to show; guessing one would mislabel a build.
    raise ImportError(
        f"{DISTRIBUTION} is not installed, so its version is unknown: install it "
        "(`pip install .`, or `make`) instead of running the source tree on its own"
    ) from exc
