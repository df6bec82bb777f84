"""``providers check``: every entry's preflight as a table or JSON, the exit codes, and the
entries that time out, fail to answer or hit a bug in their preflight, each kept to its own row
(docs/decisions/0144-the-preflight-command-and-the-start-up-check.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.admin.providers_cmd import EXIT_WOULD_FAIL
from services.providers.config import PROVIDER_TYPES, ProviderType
from services.providers.preflight import Finding
from services.testing.provider import FakeConfig, FakeProvider, FakeProviderWithPreflight
from tests.support.clirun import cli, restore_logging_after

restore_logging = pytest.fixture(autouse=True)(restore_logging_after)

GOOD = """\
  - name: here
    type: local
    local: {}
  - name: fake-plain
    type: fake
    fake: {}
  - name: fake-good
    type: fake
    fake:
      preflight:
        findings:
          - {check: credentials, ok: true, detail: token accepted}
          - {check: size in fsn1, ok: true, detail: cx23 offered in fsn1}
"""
BAD = """\
  - name: fake-bad
    type: fake
    fake:
      preflight:
        findings:
          - {check: credentials, ok: true, detail: token accepted}
          - check: size in nyc1
            ok: false
            detail: s-1vcpu-512mb-10gb is not offered in nyc1
            fix: use a region where it is offered, e.g. ams3
"""


def config(tmp_path: Path, *blocks: str) -> Path:
    path = tmp_path / "providers.yaml"
    path.write_text("providers:\n" + "".join(blocks))
    return path


async def check(path: Path, *args: str) -> tuple[int, str, str]:
    result = await cli(
        "providers", "check", "--providers-config", str(path), "--data-dir", str(path.parent),
        *args,
    )  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


def rows(stdout: str) -> list[list[str]]:
    """The table's rows, cells split on runs of two spaces (no cell here has two in a row)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in lines[1:-1]]


async def test_every_entry_that_would_work_exits_0_with_a_row_per_finding(
    tmp_path: Path,
) -> None:
    code, out, err = await check(config(tmp_path, GOOD))
    assert code == 0, out + err
    assert out.splitlines()[0].split() == ["ENTRY", "TYPE", "CHECK", "VERDICT", "DETAIL", "FIX"]
    assert rows(out) == [
        ["here", "local", "preflight", "ok", "nothing to check for type local", "-"],
        ["fake-plain", "fake", "preflight", "ok", "nothing to check for type fake", "-"],
        ["fake-good", "fake", "credentials", "ok", "token accepted", "-"],
        ["fake-good", "fake", "size in fsn1", "ok", "cx23 offered in fsn1", "-"],
    ]
    assert out.splitlines()[-1] == "3 entries checked: every one would work"
    assert err == ""


async def test_a_failing_finding_exits_14_naming_the_entry_the_check_and_the_fix(
    tmp_path: Path,
) -> None:
    code, out, err = await check(config(tmp_path, GOOD, BAD))
    assert code == EXIT_WOULD_FAIL == 14
    assert [
        "fake-bad",
        "fake",
        "size in nyc1",
        "fails",
        "s-1vcpu-512mb-10gb is not offered in nyc1",
        "use a region where it is offered, e.g. ams3",
    ] in rows(out)
    assert out.splitlines()[-1] == "4 entries checked: 1 would fail"
    assert err.strip().splitlines()[-1] == (
        "error: these provider entries would fail: fake-bad (size in nyc1); "
        "the FIX column says what to change"
    )


async def test_json_gives_every_entry_and_finding_to_a_script(tmp_path: Path) -> None:
    code, out, _ = await check(config(tmp_path, GOOD, BAD), "-o", "json")
    assert code == EXIT_WOULD_FAIL
    answer = json.loads(out)
    assert answer["ok"] is False
    assert [(e["name"], e["type"], e["ok"]) for e in answer["entries"]] == [
        ("here", "local", True),
        ("fake-plain", "fake", True),
        ("fake-good", "fake", True),
        ("fake-bad", "fake", False),
    ]
    assert answer["entries"][3]["findings"][1] == {
        "check": "size in nyc1",
        "ok": False,
        "detail": "s-1vcpu-512mb-10gb is not offered in nyc1",
        "fix": "use a region where it is offered, e.g. ams3",
    }
    code, out, _ = await check(config(tmp_path, GOOD), "-o", "json")
    assert code == 0
    assert json.loads(out)["ok"] is True


async def test_a_bad_config_exits_2_before_any_entry_is_asked(tmp_path: Path) -> None:
    path = config(tmp_path, GOOD, "  - name: x\n    type: fake\n    fake: {latency: -1}\n")
    code, out, err = await check(path)
    assert code == 2
    assert out == ""
    assert "providers[3] (x): fake.latency" in err
    failing_without_fix = "          - {check: quota, ok: false, detail: none left}\n"
    code, _, err = await check(config(tmp_path, BAD, failing_without_fix))
    assert code == 2
    assert "finding 'quota' fails, so it needs a `fix`" in err
    assert "fake.preflight.findings[2]" in err


async def test_an_entry_that_does_not_answer_in_time_fails_alone(tmp_path: Path) -> None:
    slow = "  - name: slow\n    type: fake\n    fake: {preflight: {delay: 600}}\n"
    code, out, err = await check(config(tmp_path, GOOD, slow), "--timeout", "0.05")
    assert code == EXIT_WOULD_FAIL
    assert rows(out)[-1][:5] == ["slow", "fake", "preflight", "fails", "no answer within 0.05 s"]
    assert "reaches the provider's API" in rows(out)[-1][5]
    assert [r[3] for r in rows(out)[:-1]] == ["ok"] * 4
    assert "would fail: slow (preflight)" in err


async def test_an_api_that_refuses_the_preflight_is_a_finding(tmp_path: Path) -> None:
    down = "  - name: down\n    type: fake\n    fake: {preflight: {error: 503 Bad Gateway}}\n"
    code, out, _ = await check(config(tmp_path, GOOD, down))
    assert code == EXIT_WOULD_FAIL
    assert rows(out)[-1][:5] == [
        "down",
        "fake",
        "preflight",
        "fails",
        "Transient: 503 Bad Gateway",
    ]


async def test_a_bug_in_one_preflight_is_that_entry_s_finding_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def buggy(name: str, _config: FakeConfig) -> FakeProvider:
        return FakeProviderWithPreflight(name, error=RuntimeError("list index out of range"))

    loaded = (FakeConfig, buggy)
    monkeypatch.setitem(PROVIDER_TYPES, "buggy", ProviderType(lambda: loaded))
    buggy_entry = "  - name: bug\n    type: buggy\n    buggy: {}\n"
    code, out, err = await check(config(tmp_path, buggy_entry, GOOD))
    assert code == EXIT_WOULD_FAIL
    failing = ["bug", "buggy", "preflight", "fails", "RuntimeError: list index out of range"]
    assert rows(out)[0][:5] == failing
    assert "a bug in this provider type's preflight" in rows(out)[0][5]
    assert [r[3] for r in rows(out)[1:]] == ["ok"] * 4
    assert "Traceback" in err  # logged, for the report the fix asks for


async def test_each_entry_s_provider_is_closed_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[FakeProvider] = []

    def remembered(name: str, _config: FakeConfig) -> FakeProvider:
        provider = FakeProviderWithPreflight(name, findings=[Finding("image", True, "found")])
        built.append(provider)
        return provider

    monkeypatch.setitem(PROVIDER_TYPES, "kept", ProviderType(lambda: (FakeConfig, remembered)))
    entries = "".join(f"  - name: k{i}\n    type: kept\n    kept: {{}}\n" for i in range(3))
    code, _, _ = await check(config(tmp_path, entries))
    assert code == 0
    assert [p.name for p in built] == ["k0", "k1", "k2"]
    assert all(p.closed and p.calls == [("preflight", p.name)] for p in built)


async def test_what_a_cloud_answered_is_shown_inert(tmp_path: Path) -> None:
    hostile = (
        "  - name: hostile\n    type: fake\n    fake:\n      preflight:\n        findings:\n"
        '          - {check: "[bold]quota", ok: false, detail: "\\e[2Jgone", fix: "[red]\\rok"}\n'
    )
    code, out, err = await check(config(tmp_path, hostile))
    assert code == EXIT_WOULD_FAIL
    assert "\x1b" not in out + err
    assert "\r" not in out + err
    assert "[bold]quota" in out
    assert "[red]" in out
    assert "hostile ([bold]quota)" in err
    assert out.splitlines()[-1] == "1 entry checked: 1 would fail"
