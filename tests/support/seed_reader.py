"""Reading a NoCloud seed ISO back, as cloud-init's reader sees it: the tests' oracle for what
``services.providers.kvm.pure.seed`` builds. It names the files itself rather than sharing the
builder's table, so a wrong name in the builder fails here instead of agreeing with itself."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pycdlib

SEED_FILES = ("user-data", "meta-data", "vendor-data")


@dataclass(frozen=True, slots=True)
class SeedContents:
    label: str
    files: dict[str, str]


def read_seed_iso(data: bytes) -> SeedContents:
    """The label and the files under their Rock Ridge names; raises ValueError for bytes that
    are not an ISO or lack a file."""
    iso = pycdlib.PyCdlib()
    try:
        iso.open_fp(io.BytesIO(data))
    except pycdlib.pycdlibexception.PyCdlibException as exc:
        raise ValueError(f"not an ISO9660 image: {exc}") from exc
    try:
        label = iso.pvd.volume_identifier.decode().rstrip(" ")
        files: dict[str, str] = {}
        for name in SEED_FILES:
            out = io.BytesIO()
            try:
                iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            except pycdlib.pycdlibexception.PyCdlibException as exc:
                raise ValueError(f"the ISO has no {name}: {exc}") from exc
            files[name] = out.getvalue().decode()
    finally:
        iso.close()
    return SeedContents(label=label, files=files)
