"""Options that a flag or an environment variable can set, named one way everywhere.

Deployments set most options through the environment (deploy/services/config.yaml), so an
option's variable is derived from its long flag rather than typed beside it, and ``--help`` shows
it in one format: ``--gc-grace`` reads ``GC_GRACE`` and says ``[env GC_GRACE]``. The few that
keep a name the flag does not give (``--lease-namespace`` reads ``POD_NAMESPACE``, which the
downward API sets) say so where they are declared. The naming lives here, below every service,
so a settings Struct (``services.runtime.settings.spec``) and the messages that name a setting use
it without the CLI's library; the click options themselves are made in ``services.cli``
(``envoptions``, ``flags``).
"""

from __future__ import annotations


def env_name(flag: str) -> str:
    """``--health-check-url`` gives ``HEALTH_CHECK_URL``; a switch ``--x/--no-x`` its positive
    flag's; a parameter name (``nats_password``) the variable its flag would have."""
    first = flag.split("/", 1)[0].strip().lstrip("-")
    return first.replace("-", "_").upper()


def env_help(text: str, env: str) -> str:
    """Every option shows its variable the same way, at the end: an operator looks there."""
    return f"{text.rstrip().removesuffix('.')} [env {env}]."
