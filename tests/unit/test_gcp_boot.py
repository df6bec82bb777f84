"""Which key an image runs, the user data's parts as cloud-init sees them, and the startup-script
run by a real ``sh`` in a scratch directory: parts in name order, byte for byte, once per VM,
standing aside for cloud-init only when ``user-data`` is sent too (D140)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.guard import with_guard
from services.providers.gcp.pure import boot
from services.providers.gcp.pure.boot import Boot
from services.providers.squidauth.pure.cloudinit import with_script_part


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("projects/debian-cloud/global/images/family/debian-12", Boot.GUEST_AGENT),
        ("projects/debian-cloud/global/images/debian-12-bookworm-v20251209", Boot.GUEST_AGENT),
        (
            "https://www.googleapis.com/compute/v1/projects/rocky-linux-cloud/global/images/"
            "family/rocky-linux-9",
            Boot.GUEST_AGENT,
        ),
        ("projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64", Boot.CLOUD_INIT),
        ("projects/cos-cloud/global/images/family/cos-stable", Boot.CLOUD_INIT),
        ("projects/my-project/global/images/squid-golden", Boot.UNKNOWN),
        ("global/images/squid-golden", Boot.UNKNOWN),
        ("img/x", Boot.UNKNOWN),
    ],
)
def test_the_key_follows_the_image_project(image: str, expected: Boot) -> None:
    assert boot.boot_of(image) is expected


def test_keys_per_boot() -> None:
    assert boot.keys_for(Boot.CLOUD_INIT) == ("user-data",)
    assert boot.keys_for(Boot.GUEST_AGENT) == ("startup-script",)
    assert boot.keys_for(Boot.UNKNOWN) == ("user-data", "startup-script")


def test_parts_are_what_cloud_init_sees() -> None:
    assert boot.parts("") == []
    (only,) = boot.parts("#!/bin/bash\necho hi\n")
    assert (only.name, only.kind) == ("part-001", boot.SHELL)
    (config,) = boot.parts("#cloud-config\npackages: [squid]\n")
    assert config.kind == "#cloud-config"
    mixed = with_guard("#cloud-config\npackages: [squid]\n", (), snippet=True)
    found = boot.parts(mixed)
    assert [(p.name, p.kind) for p in found] == [
        ("part-001", "#cloud-config"),
        (GUARD_PART, boot.SHELL),
    ]
    assert [p.name for p in boot.not_run(found)] == ["part-001"]


def _script(user_data: str, *, with_user_data: bool, state: Path) -> str:
    text = boot.startup_script(user_data, with_user_data=with_user_data)
    assert f"state={boot.STATE_DIR}\n" in text
    return text.replace(f"state={boot.STATE_DIR}\n", f"state={state}\n")


def _run(script: str, tmp: Path, *, cloud_init: bool) -> subprocess.CompletedProcess[str]:
    """``script`` under ``sh``, with a ``cloud-init`` program on the PATH or not."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "cloud-init"
    if cloud_init:
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    elif fake.exists():
        fake.unlink()
    path = tmp / "startup.sh"
    path.write_text(script)
    # Only the scratch bin and the base system: a cloud-init on this machine must not count.
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    if not cloud_init:
        assert not any(Path(d, "cloud-init").exists() for d in ("/usr/bin", "/bin")), (
            "this machine has cloud-init in /usr/bin: the test cannot hide it"
        )
    return subprocess.run(
        ["/bin/sh", str(path)], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def _user_data(out: Path) -> str:
    """Three shell parts written out of name order, one with a bash shebang and a line like a
    here-document end, and a #cloud-config part."""
    tricky = (
        f"#!/bin/bash\nprintf '%s\\n' \"${{BASH_VERSION:+bash}}\" >> {out}\n"
        "cat >/dev/null <<'EGRESS_PART_2_EOF'\nEGRESS_PART_2_EOF\n"
        f"echo b >> {out}\n"
    )
    data = with_script_part("#cloud-config\npackages: [squid]\n", tricky, "b-second.sh")
    data = with_script_part(data, f"#!/bin/sh\necho c >> {out}\n", "c-third.sh")
    return with_script_part(data, f"#!/bin/sh\necho a >> {out}\n", "a-first.sh")


def test_the_startup_script_runs_each_shell_part_in_name_order_once(tmp_path: Path) -> None:
    out = tmp_path / "out"
    state = tmp_path / "state"
    script = _script(_user_data(out), with_user_data=False, state=state)
    first = _run(script, tmp_path, cloud_init=False)
    assert first.returncode == 0, first.stderr
    assert out.read_text().splitlines() == ["a", "bash", "b", "c"]
    # The #cloud-config part is said, not silently dropped.
    assert "part part-001 (#cloud-config) needs cloud-init; not run" in first.stderr
    assert (state / boot.DONE_FILE).exists()
    # The guest agent runs it again at every boot: once done, nothing runs twice.
    again = _run(script, tmp_path, cloud_init=False)
    assert again.returncode == 0
    assert "already ran" in again.stdout
    assert out.read_text().splitlines() == ["a", "bash", "b", "c"]


def test_a_failed_part_leaves_the_next_boot_to_try_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    state = tmp_path / "state"
    data = with_script_part("#!/bin/sh\nexit 3\n", f"#!/bin/sh\necho after >> {out}\n", "z.sh")
    ran = _run(_script(data, with_user_data=False, state=state), tmp_path, cloud_init=False)
    assert ran.returncode == 1
    assert "part part-001 failed" in ran.stderr
    assert out.read_text() == "after\n"  # the parts after a failed one still run
    assert not (state / boot.DONE_FILE).exists()


@pytest.mark.parametrize("with_user_data", [True, False])
def test_it_stands_aside_for_cloud_init_only_when_user_data_is_sent_too(
    tmp_path: Path, with_user_data: bool
) -> None:
    out = tmp_path / "out"
    data = f"#!/bin/sh\necho ran >> {out}\n"
    script = _script(data, with_user_data=with_user_data, state=tmp_path / "state")
    ran = _run(script, tmp_path, cloud_init=True)
    assert ran.returncode == 0, ran.stderr
    assert out.exists() is not with_user_data


def test_the_real_parts_are_carried_byte_for_byte() -> None:
    data = with_guard("#!/bin/sh\necho proxy\n", (), snippet=True)
    script = boot.startup_script(data, with_user_data=False)
    for part in boot.parts(data):
        assert part.content in script
