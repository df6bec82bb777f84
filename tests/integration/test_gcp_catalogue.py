"""The gcp provider against a fake that boots images as GCE's do and keeps GCE's catalogue: the
script goes in the key the image runs, a #cloud-config is refused where nothing would run it, and
a machine type the zone lacks fails Permanent naming where it would work, from a cached
catalogue (D140)."""

from __future__ import annotations

import email.parser
import email.policy

import pytest

from events.schemas import Placement
from services.providers.base import Permanent, QuotaExceeded
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.gcp.provider import UBUNTU_IMAGE, GcpProvider
from services.providers.squidauth.pure.cloudinit import PART_NAME as LEASE_PART
from services.providers.squidauth.pure.cloudinit import with_lease_auth
from services.testing.gcp import ComputeFake
from tests.support.gcp_support import PROJECT, ZONE, compute_fake, config, gcp_provider, request  # noqa: F401  # fixtures `fake` and `gcp`

pytestmark = pytest.mark.integration

SHELL_INIT = "#!/bin/sh\napt-get install -y squid\n"
ROCKY = "projects/rocky-linux-cloud/global/images/family/rocky-linux-9"


def inserts(fake: ComputeFake) -> list[str]:
    return [path for method, path in fake.requests if method == "POST"]


# ----------------------------------------------------------------------------- the image's key


async def test_debian_runs_the_script_from_the_startup_script(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    """Debian's guest agent runs ``startup-script``, never ``user-data``: with the script in
    ``user-data`` only, the VM would run nothing."""
    cloud_init = with_lease_auth(SHELL_INIT, "ab" * 32, "print('helper')\n")
    await gcp.create(request("px-deb", cloud_init=cloud_init))
    ran = fake.ran(ZONE, "px-deb")
    assert list(ran) == ["startup-script"]
    script = ran["startup-script"]
    # The Proxy's own shell part, the guard part and the lease part, in that (name) order.
    assert (
        script.index(SHELL_INIT)
        < script.index("Squid's user never reaches")
        < (script.index("only the holder of a current lease"))
    )
    assert "command -v cloud-init" not in script  # only user-data would make it stand aside


@pytest.mark.parametrize("image", [UBUNTU_IMAGE, ROCKY])
async def test_each_image_runs_the_key_it_is_given(fake: ComputeFake, image: str) -> None:
    provider = GcpProvider("gcp-eu", config(fake, image=image))
    try:
        await provider.create(request("px-img", cloud_init=SHELL_INIT))
    finally:
        await provider.close()
    ran = fake.ran(ZONE, "px-img")
    expected = "user-data" if image == UBUNTU_IMAGE else "startup-script"
    assert list(ran) == [expected]
    if expected == "user-data":
        parts = email.parser.Parser(policy=email.policy.default).parsestr(ran["user-data"])
        assert [p.get_filename() for p in parts.iter_parts()] == ["part-001", GUARD_PART]


async def test_a_cloud_config_is_refused_where_no_cloud_init_would_run_it(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    cloud_init = with_lease_auth("#cloud-config\npackages: [squid]\n", "ab" * 32, "pass\n")
    with pytest.raises(Permanent) as caught:
        await gcp.create(request("px-cc", cloud_init=cloud_init))
    message = str(caught.value)
    assert "spec.cloudInit part part-001 is #cloud-config" in message
    assert "debian-12" in message
    assert UBUNTU_IMAGE in message  # where it would run
    assert inserts(fake) == []
    # The same cloud-init on Ubuntu goes as user-data, lease part included.
    on_ubuntu = request("px-cc", cloud_init=cloud_init, placement=Placement(image=UBUNTU_IMAGE))
    await gcp.create(on_ubuntu)
    ran = fake.ran(ZONE, "px-cc")
    assert list(ran) == ["user-data"]
    assert LEASE_PART in ran["user-data"]


# ----------------------------------------------------------------------------- the catalogue


async def test_a_machine_type_the_zone_lacks_is_permanent_and_names_where_it_is(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    wanted = request("px-c3", placement=Placement(machine_type="c3-standard-4"))
    with pytest.raises(Permanent) as caught:
        await gcp.create(wanted)
    message = str(caught.value)
    assert f"machineType 'c3-standard-4' is not offered in zone '{ZONE}'" in message
    # The zones of the same region first.
    assert message.endswith("it is offered in europe-west1-d, europe-west4-a, us-central1-a")
    assert inserts(fake) == []
    # Asked again (the reconciler's next pass, another Proxy): the catalogue is not.
    fake.requests.clear()
    with pytest.raises(Permanent, match="offered in europe-west1-d"):
        await gcp.create(wanted)
    assert fake.requests == []


async def test_the_fake_refuses_it_as_gce_does(gcp: GcpProvider, fake: ComputeFake) -> None:
    """Past the check (the catalogue answered 403, so the insert judges), GCE's own 400."""
    fake.inject(403, "forbidden", kind="machineTypes")
    with pytest.raises(Permanent, match="Machine type with name 'c3-standard-4' does not exist"):
        await gcp.create(request("px-c3", placement=Placement(machine_type="c3-standard-4")))
    assert len(inserts(fake)) == 1


async def test_an_offered_machine_type_is_looked_up_once_an_hour(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    for name in ("px-1", "px-2", "px-3"):
        await gcp.create(request(name))
    lookups = [path for _, path in fake.requests if "/machineTypes/" in path]
    assert lookups == [f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/machineTypes/e2-small"]
    assert len(inserts(fake)) == 3


async def test_a_zone_the_catalogue_drops_later_is_seen_within_the_hour(
    fake: ComputeFake,
) -> None:
    provider = GcpProvider("gcp-eu", config(fake))
    now = [0.0]
    provider.catalogue.cache.clock = lambda: now[0]
    try:
        await provider.create(request("px-a"))
        fake.offer(ZONE, "e2-micro")  # e2-small withdrawn from the zone
        now[0] = 3601.0
        with pytest.raises(Permanent, match="'e2-small' is not offered"):
            await provider.create(request("px-b"))
    finally:
        await provider.close()


async def test_a_vm_over_the_region_quota_is_refused_as_gce_does(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    fake.quota("europe-west1", "E2_CPUS", limit=4)
    await gcp.create(request("px-q1"))
    await gcp.create(request("px-q2"))
    with pytest.raises(QuotaExceeded, match="Quota 'E2_CPUS' exceeded"):
        await gcp.create(request("px-q3"))
