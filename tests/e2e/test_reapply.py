"""The sequence a new user hit: apply, delete, apply again; the proxy must be listed, probed,
leasable and deletable, and nothing may run on afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.system import hello_target, processes_mentioning, running_up

pytestmark = pytest.mark.e2e

DE3 = """apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: de-3, namespace: crawl}
spec:
  provider: local
  attributes: {country: de}
"""


async def test_apply_delete_apply_get_lease_delete(tmp_path: Path) -> None:
    manifest = tmp_path / "de3.yaml"
    manifest.write_text(DE3)
    with hello_target() as target:
        async with running_up(tmp_path, "--observe-interval", "1", health_check_url=target) as up:
            for step in (
                ("apply", "-f", str(manifest), "--wait"),
                ("delete", "crawl/de-3", "--wait"),
                ("apply", "-f", str(manifest), "--wait"),
            ):
                done = await up.cli(*step)
                assert done.returncode == 0, (step, done.stdout + done.stderr)
            assert "created" in done.stdout

            listed = {p["name"]: p for p in await up.proxies()}
            assert listed["de-3"]["phase"] == "Ready"
            assert listed["de-3"]["healthy"] is True
            status, api_listed = await up.api_call("GET", "/v1/proxies")
            assert status == 200
            assert [p["name"] for p in api_listed["items"]] == ["de-3"]

            status, lease = await up.api_call(
                "POST", "/v1/leases", {"selector": {"country": "de"}, "ttlSeconds": 30}
            )
            assert status == 201, lease
            assert lease["proxy"]["name"] == "de-3"

            deleted = await up.cli("delete", "crawl/de-3", "--wait")
            assert deleted.returncode == 0, deleted.stdout + deleted.stderr
            assert "absent" not in deleted.stdout
            assert await up.proxies() == []
    instances = (tmp_path / "data" / "local" / "instances").resolve()
    assert processes_mentioning(str(instances)) == []
