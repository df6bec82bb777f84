"""The NoCloud seed ISO: read back with pycdlib and with the Linux tools cloud-init relies on
(blkid finds the seed by its label; the kernel shows Rock Ridge names, as isoinfo -R does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.providers.kvm.pure.config import DEFAULT_VENDOR_DATA
from services.providers.kvm.pure.seed import LABEL, build_seed_iso, meta_data_for
from tests.support.seed_reader import SeedContents, read_seed_iso

USER_DATA = """#cloud-config
packages: [squid]
write_files:
  - path: /etc/squid/conf.d/egress.conf
    content: |
      http_port 3128
      # ünïcödé survives
"""
META_DATA = meta_data_for("px-vm")
SBIN = ("/usr/sbin", "/sbin")


@pytest.fixture
def iso(tmp_path: Path) -> Path:
    path = tmp_path / "seed.iso"
    path.write_bytes(
        build_seed_iso(user_data=USER_DATA, meta_data=META_DATA, vendor_data=DEFAULT_VENDOR_DATA)
    )
    return path


def run(*args: str) -> str:
    # blkid lives in sbin, which a non-root PATH often leaves out.
    tool = shutil.which(args[0], path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))
    assert tool, f"{args[0]} is missing: install genisoimage (isoinfo) / util-linux (blkid)"
    result = subprocess.run([tool, *args[1:]], capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout.decode()


def test_meta_data_names_the_instance_and_host() -> None:
    assert yaml.safe_load(meta_data_for("px-vm")) == {
        "instance-id": "px-vm",
        "local-hostname": "px-vm",
    }
    # A name YAML would otherwise read as a number stays a string.
    assert yaml.safe_load(meta_data_for("1234"))["instance-id"] == "1234"


def test_read_back_with_pycdlib(iso: Path) -> None:
    assert read_seed_iso(iso.read_bytes()) == SeedContents(
        label="cidata",
        files={"user-data": USER_DATA, "meta-data": META_DATA, "vendor-data": DEFAULT_VENDOR_DATA},
    )
    assert LABEL == "cidata"


def test_empty_vendor_data_is_an_empty_file() -> None:
    data = build_seed_iso(user_data="", meta_data=META_DATA, vendor_data="")
    assert read_seed_iso(data).files == {"user-data": "", "meta-data": META_DATA, "vendor-data": ""}


def test_the_same_input_gives_a_readable_iso_each_time() -> None:
    first = build_seed_iso(user_data="a", meta_data="b", vendor_data="c")
    second = build_seed_iso(user_data="a", meta_data="b", vendor_data="c")
    assert read_seed_iso(first) == read_seed_iso(second)
    assert len(first) % 2048 == 0


def test_not_an_iso_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not an ISO9660 image"):
        read_seed_iso(b"\0" * 65536)


def test_isoinfo_sees_the_label_and_exact_names(iso: Path) -> None:
    info = run("isoinfo", "-d", "-i", str(iso))
    assert "Volume id: cidata" in info
    assert "Rock Ridge signatures" in info
    assert "Joliet" in info
    rock_ridge = run("isoinfo", "-R", "-f", "-i", str(iso)).split()
    assert sorted(rock_ridge) == ["/meta-data", "/user-data", "/vendor-data"]
    joliet = run("isoinfo", "-J", "-f", "-i", str(iso)).split()
    assert sorted(joliet) == ["/meta-data", "/user-data", "/vendor-data"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("user-data", USER_DATA), ("meta-data", META_DATA), ("vendor-data", DEFAULT_VENDOR_DATA)],
)
def test_isoinfo_extracts_each_file(iso: Path, name: str, expected: str) -> None:
    assert run("isoinfo", "-R", "-x", f"/{name}", "-i", str(iso)) == expected
    assert run("isoinfo", "-J", "-x", f"/{name}", "-i", str(iso)) == expected


def test_blkid_finds_the_seed_by_label(iso: Path) -> None:
    # What cloud-init's NoCloud source does to find the seed among the block devices.
    out = run("blkid", "-p", "-o", "export", str(iso))
    fields = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert fields["TYPE"] == "iso9660"
    assert fields["LABEL"] == "cidata"
