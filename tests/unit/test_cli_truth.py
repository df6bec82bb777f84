"""What the CLI says about itself agrees with what it does
(docs/decisions/0098-commands-tell-the-truth-exit.md): the exit codes in ``--help`` are the README's
and the ones the commands raise, the README's ``nats`` line is the banner's read-only one, and the
refusal of an unknown provider names the proxy and the fix."""

from __future__ import annotations

import re

from events.proxyresource import ProxyResource, from_object
from services.cli.admin.providers_cmd import EXIT_WOULD_FAIL
from services.cli.backup.backup_cmd import EXIT_BACKUP_DAMAGED
from services.cli.common import EXIT_NOT_DONE, EXIT_SWEEP_INCOMPLETE
from services.cli.fleet.manifests import unknown_providers
from services.cli.lease.api_client import (
    EXIT_NO_MATCH,
    EXIT_NO_PROXY,
    EXIT_ROTATION_NOT_DONE,
    EXIT_UNKNOWN_LEASE,
)
from services.cli.log.check_cmd import EXIT_UNUSABLE
from services.cli.main import EPILOG, EXIT_CODES
from services.runtime.nats.credentials import CONTEXT_FILE, READER_CONTEXT_FILE
from tests.support.system import ROOT

README = (ROOT / "README.md").read_text()


def epilog_codes() -> dict[int, str]:
    return {
        int(m.group(1)): m.group(2) for m in re.finditer(r"^ {1,2}(\d+) {2}(.+)$", EPILOG, re.M)
    }


def readme_codes() -> dict[int, str]:
    table = README.split("Exit codes:", 1)[1].split("\n## ", 1)[0]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", table, re.M)}


def test_every_exit_code_is_in_help_and_in_the_readme_and_one_means_a_bug() -> None:
    raised = {code for _, code in EXIT_CODES} | {
        EXIT_NO_PROXY,
        EXIT_UNKNOWN_LEASE,
        EXIT_NO_MATCH,
        EXIT_UNUSABLE,
        EXIT_NOT_DONE,
        EXIT_ROTATION_NOT_DONE,
        EXIT_SWEEP_INCOMPLETE,
        EXIT_BACKUP_DAMAGED,
        EXIT_WOULD_FAIL,
    }
    assert len(raised) == 13  # 2 to 14: one code, one meaning
    assert set(epilog_codes()) == set(readme_codes()) == {0, 1} | raised
    assert "a bug" in epilog_codes()[1]
    assert "a bug" in readme_codes()[1]
    assert "apply --wait" in readme_codes()[EXIT_NOT_DONE]
    assert "lease rotate --wait" in readme_codes()[EXIT_ROTATION_NOT_DONE]
    assert "gc run-once" in readme_codes()[EXIT_SWEEP_INCOMPLETE]


def test_the_readme_reads_the_log_through_the_reader_as_the_banner_does() -> None:
    # The banner (cli/up_cmd.py) prints `nats --context <reader context> stream ls`.
    assert f"nats --context .data/nats/{READER_CONTEXT_FILE} stream ls" in README
    assert f"nats --context .data/nats/{CONTEXT_FILE} " not in README


def resource(name: str, provider: str) -> ProxyResource:
    document = {
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl"},
        "spec": {"provider": provider},
    }
    return from_object(document, "test")


def test_an_unknown_provider_is_refused_naming_the_proxy_the_names_and_the_way_out() -> None:
    known = frozenset({"local", "gcp"})
    assert unknown_providers([resource("a", "local"), resource("b", "gcp")], known, "s1") is None
    refused = unknown_providers(
        [resource("a", "local"), *(resource(f"x{i}", "gcp-eu") for i in range(7))], known, "s1"
    )
    assert refused is not None
    assert refused.startswith("crawl/x0: spec.provider 'gcp-eu'; crawl/x1:")
    assert "crawl/x5" not in refused
    assert " and 2 more: not a provider of the running system" in refused
    assert "(its last GC sweep, s1, had: gcp, local)" in refused
    assert "--no-provider-check" in refused
