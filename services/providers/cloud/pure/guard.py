"""The user-data part that keeps a cloud VM's Squid off the metadata service, whatever its rules.

Squid's own rules (``providers/pure/targets.py``) refuse link-local and metadata destinations,
but the VM's user data holds the proxy's lease key, so a rule that is wrong one day would hand a
holder the key for good (docs/decisions/0134-where-a-proxy-lets-its-holder-go.md). This part adds
a second, independent layer: a host firewall rule matching the Squid user (its helpers run as it
too) refuses link-local and ``fd00:ec2::254``, except DNS to a link-local resolver (GCE's
``/etc/resolv.conf`` names 169.254.169.254, and Squid resolves as its own user).

iptables rules do not survive a reboot, and cloud-init runs user data once, so the rules are a
program run before every Squid start (a systemd drop-in's ``ExecStartPre``): a Squid whose guard
fails does not start. The same program writes the host's own addresses, which Squid refuses as
destinations (``OWN_ADDRESSES``), fresh at each start. nft is used when present, else iptables;
with neither, nftables is installed.

On gcp and kvm (and on a cloud entry with ``installSquid: false``) the Squid is the image's,
configured by Debian's ``squid.conf``, which includes ``conf.d`` before its own ``http_access``
rules: the part also writes the destination rules there (``SNIPPET_PATH``), after the lease
snippet and before any ``allow``. Pure: nothing is read or run here.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.providers.pure.targets import AllowedTarget, header_lines, target_lines
from services.providers.squidauth.pure.cloudinit import with_script_part

PART_NAME = "zx-egress-guard.sh"
"""Sorts before the Squid part (``zy-``) and the lease part (``zz-``), which restart Squid."""
GUARD_PATH = "/usr/local/lib/egress-proxies/egress-guard.sh"
DROP_IN_PATH = "/etc/systemd/system/squid.service.d/egress-guard.conf"
OWN_ADDRESSES = "/etc/squid/egress-own-addresses"
SNIPPET_PATH = "/etc/squid/conf.d/00-egress-targets.conf"
"""Read after ``00-egress-lease.conf`` (the lease rules come first) and before the rest."""
NFT_TABLE = "egress_proxies"
CHAIN = "EGRESS_PROXIES"
_END = "EGRESS_GUARD_EOF"

_GUARD = f"""#!/bin/sh
# egress-proxies: run before every Squid start
# (docs/decisions/0134-where-a-proxy-lets-its-holder-go.md)
# The Squid user and its helpers may not reach link-local addresses or fd00:ec2::254 (the
# clouds' metadata services), except DNS to a link-local resolver; Squid refuses this host's
# own addresses, listed here.
set -eu
user=proxy
id -u proxy >/dev/null 2>&1 || user=squid
if ! uid=$(id -u "$user" 2>/dev/null); then
  echo "egress-proxies: no proxy or squid user yet; the guard runs when Squid starts" >&2
  exit 0
fi
{{ echo 127.0.0.1; ip -o addr show 2>/dev/null | awk '{{print $4}}' | cut -d/ -f1; }} \\
  | sort -u > {OWN_ADDRESSES}.new
mv {OWN_ADDRESSES}.new {OWN_ADDRESSES}
resolvers=$(awk '$1 == "nameserver" && $2 ~ /^169[.]254[.]/ {{print $2}}' /etc/resolv.conf)
if command -v nft >/dev/null 2>&1; then
  {{
    echo "table inet {NFT_TABLE}"
    echo "delete table inet {NFT_TABLE}"
    echo "table inet {NFT_TABLE} {{"
    echo "  chain output {{"
    echo "    type filter hook output priority 0; policy accept;"
    for r in $resolvers; do
      echo "    meta skuid $uid ip daddr $r udp dport 53 accept"
      echo "    meta skuid $uid ip daddr $r tcp dport 53 accept"
    done
    echo "    meta skuid $uid ip daddr 169.254.0.0/16 reject"
    echo "    meta skuid $uid ip6 daddr {{ fe80::/10, fd00:ec2::254 }} reject"
    echo "  }}"
    echo "}}"
  }} | nft -f -
elif command -v iptables >/dev/null 2>&1; then
  for t in iptables ip6tables; do
    command -v "$t" >/dev/null 2>&1 || continue
    "$t" -w -N {CHAIN} 2>/dev/null || "$t" -w -F {CHAIN}
    "$t" -w -C OUTPUT -m owner --uid-owner "$uid" -j {CHAIN} 2>/dev/null \\
      || "$t" -w -I OUTPUT 1 -m owner --uid-owner "$uid" -j {CHAIN}
  done
  for r in $resolvers; do
    iptables -w -A {CHAIN} -d "$r" -p udp --dport 53 -j ACCEPT
    iptables -w -A {CHAIN} -d "$r" -p tcp --dport 53 -j ACCEPT
  done
  iptables -w -A {CHAIN} -d 169.254.0.0/16 -j REJECT
  if command -v ip6tables >/dev/null 2>&1; then
    ip6tables -w -A {CHAIN} -d fe80::/10 -j REJECT
    ip6tables -w -A {CHAIN} -d fd00:ec2::254 -j REJECT
  fi
else
  echo "egress-proxies: neither nft nor iptables; Squid stays stopped" >&2
  exit 1
fi
"""

_DROP_IN = f"""[Service]
ExecStartPre=/bin/sh {GUARD_PATH}
"""


def guard_program() -> str:
    """The program run before every Squid start: the firewall rules and the own addresses."""
    return _GUARD


def vm_snippet(targets: Sequence[AllowedTarget]) -> str:
    """The ``conf.d`` snippet for an image's own Squid: Debian's ``squid.conf`` caches and adds
    ``Via`` and ``X-Forwarded-For``, so the snippet turns those off too."""
    lines = [
        "# egress-proxies: where a leased proxy lets its holder go (D134)",
        "cache deny all",
        *header_lines(),
        *target_lines(targets, own_addresses_file=OWN_ADDRESSES),
    ]
    return "\n".join(lines) + "\n"


def guard_script(targets: Sequence[AllowedTarget], *, snippet: bool) -> str:
    """The part: writes the guard and its drop-in, runs it once, and (``snippet``) writes the
    destination rules for an image's Squid. Idempotent."""
    conf = ""
    if snippet:
        conf = f"cat > {SNIPPET_PATH} <<'{_END}'\n{vm_snippet(targets).rstrip()}\n{_END}\n"
    return f"""#!/bin/sh
# egress-proxies: Squid's user never reaches the metadata service
# (docs/decisions/0134-where-a-proxy-lets-its-holder-go.md)
set -eu
umask 022
mkdir -p /usr/local/lib/egress-proxies /etc/squid/conf.d /etc/systemd/system/squid.service.d
if ! command -v nft >/dev/null 2>&1 && ! command -v iptables >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q nftables
fi
cat > {GUARD_PATH} <<'{_END}'
{_GUARD.rstrip()}
{_END}
chmod 0755 {GUARD_PATH}
cat > {DROP_IN_PATH} <<'{_END}'
{_DROP_IN.rstrip()}
{_END}
{conf}/bin/sh {GUARD_PATH}
if command -v systemctl >/dev/null 2>&1; then
  systemctl daemon-reload
  if systemctl cat squid >/dev/null 2>&1; then
    systemctl restart squid
  fi
fi
"""


def with_guard(user_data: str, targets: Sequence[AllowedTarget], *, snippet: bool) -> str:
    """``user_data`` plus the guard part, as MIME multipart user data."""
    return with_script_part(user_data, guard_script(targets, snippet=snippet), PART_NAME)
