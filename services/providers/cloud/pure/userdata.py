"""The user-data part that makes a cloud VM an egress Squid.

A shell-script part, like the lease part (``squidauth/pure/cloudinit.py``) and for the same
reason: a ``#cloud-config`` part would be merged with the Proxy's own by cloud-init's list rules
and could lose its ``packages`` or ``runcmd``; a script part cannot. cloud-init runs script parts
in name order in its final stage: this one (``zy-``) runs after the Proxy's own parts and before
the lease part (``zz-``), which adds its ``conf.d`` snippet and restarts Squid.

The Squid it configures is the one every provider runs (``providers/pure/squidconf.py``): no
cache, client addresses hidden, ``allowedClients`` only, listening on ``proxyPort``, reaching
public addresses and the entry's ``allowedTargets`` only, never this host's own addresses (the
guard part, ``guard.py``, lists them at every Squid start and keeps the metadata service out
of the Squid user's reach at the host firewall: D134). It is
written for Debian and Ubuntu images (apt, the ``proxy`` user, ``/etc/squid``), the default
image of every cloud provider here. Pure: nothing is read or run here.
"""

from __future__ import annotations

from services.providers.cloud.pure.guard import OWN_ADDRESSES, with_guard
from services.providers.cloud.pure.settings import CloudSettings, client_networks
from services.providers.pure.squidconf import squid_config
from services.providers.squidauth.pure.cloudinit import with_script_part

PART_NAME = "zy-egress-squid.sh"
CONF_PATH = "/etc/squid/squid.conf"
_END = "EGRESS_SQUID_EOF"


def squid_script(settings: CloudSettings, name: str) -> str:
    """Install Squid if it is missing, write its configuration, (re)start it; idempotent."""
    config = squid_config(
        listen=str(settings.proxy_port),
        name=name,
        cache_log="/var/log/squid/cache.log",
        coredump_dir="/var/spool/squid",
        allowed_clients=client_networks(settings),
        include="/etc/squid/conf.d/*.conf",
        pid_file="/run/squid.pid",  # Debian's squid.service reloads through it
        targets=settings.allowed_targets,
        own_addresses_file=OWN_ADDRESSES,
    )
    return f"""#!/bin/sh
# egress-proxies: this VM is an egress Squid for {name} (docs/providers.md, "Cloud VMs")
set -eu
if ! command -v squid >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q squid
fi
mkdir -p /etc/squid/conf.d
cat > {CONF_PATH} <<'{_END}'
{config.rstrip()}
{_END}
if command -v systemctl >/dev/null 2>&1; then
  systemctl enable squid >/dev/null 2>&1 || true
  systemctl restart squid
fi
"""


def vm_user_data(cloud_init: str, settings: CloudSettings, name: str) -> str:
    """The user data a VM is created with: the Proxy's cloud-init (with the lease part, when
    the entry enforces leases), the guard part, and the Squid part unless ``installSquid`` is
    false (the guard part then writes the destination rules into the image's ``conf.d``)."""
    guarded = with_guard(cloud_init, settings.allowed_targets, snippet=not settings.install_squid)
    if not settings.install_squid:
        return guarded
    return with_script_part(guarded, squid_script(settings, name), PART_NAME)
