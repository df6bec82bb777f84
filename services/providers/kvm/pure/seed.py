"""The NoCloud seed: an ISO labelled ``cidata`` holding ``user-data``, ``meta-data`` and
``vendor-data``, built in memory so the hypervisor needs no ISO tool installed.

cloud-init finds the seed by its label and reads the files by those exact names. Plain ISO9660
allows only short upper-case names, so the ISO also carries Rock Ridge (what Linux's isofs shows
first) and Joliet (what other readers show): both spell the names exactly.
"""

from __future__ import annotations

import io
import json

import pycdlib

LABEL = "cidata"
# ISO9660 level-1 names (8.3, upper case) for readers that see neither extension.
_FILES = (
    ("user-data", "/USERDATA.;1"),
    ("meta-data", "/METADATA.;1"),
    ("vendor-data", "/VENDORDA.;1"),
)


def meta_data_for(vm_name: str) -> str:
    """NoCloud meta-data: the instance id (cloud-init's once-per-instance key) and hostname.
    Values are JSON strings, which YAML reads as strings whatever they look like."""
    name = json.dumps(vm_name)
    return f"instance-id: {name}\nlocal-hostname: {name}\n"


def build_seed_iso(*, user_data: str, meta_data: str, vendor_data: str) -> bytes:
    """The ISO's bytes; small (the three texts plus a few ISO blocks)."""
    contents = {"user-data": user_data, "meta-data": meta_data, "vendor-data": vendor_data}
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident=LABEL, joliet=3, rock_ridge="1.09")
    try:
        for name, iso_path in _FILES:
            data = contents[name].encode()
            iso.add_fp(io.BytesIO(data), len(data), iso_path, rr_name=name, joliet_path=f"/{name}")
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return out.getvalue()
