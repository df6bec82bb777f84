#!/bin/sh
# The Debian/Ubuntu packages egress-proxies needs on this machine.
#   sh deploy/host-packages.sh demo   what `make demo` and the README's "Using it" need
#   sh deploy/host-packages.sh test   that, plus what `make test` needs
# Works as root without sudo and as a user with sudo; installs only what is missing, so a second
# run does nothing (and needs no network).
set -eu

demo="make python3-venv squid curl jq"
# libvirt-python compiles against libvirt's headers; the kvm tests start a private libvirtd with
# QEMU (TCG) and a Linux bridge, and check seed images with isoinfo and domain XML with
# virt-xml-validate. prometheus provides promtool, which checks the services' /metrics output
# and the alert rules in deploy/monitoring/ (the tests start no Prometheus server). chromium and
# chromium-driver run the console's browser test headless (docs/console.md); nothing is
# downloaded when it runs. apache2-utils gives ab, which bench/gateway.py (and its tiny run in
# the tests) loads the gateway with.
test="$demo gcc python3-dev pkg-config libvirt-daemon-system libvirt-daemon-driver-qemu \
libvirt-clients libvirt-dev qemu-system-x86 qemu-utils iproute2 genisoimage prometheus \
chromium chromium-driver apache2-utils"

case "${1:-}" in
demo) wanted=$demo ;;
test) wanted=$test ;;
*)
  echo "usage: sh deploy/host-packages.sh demo|test" >&2
  exit 2
  ;;
esac

missing=""
for pkg in $wanted; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing="$missing $pkg"
done
# Python's own headers and venv may come from elsewhere than Debian (a pyenv build has both).
if [ -n "$missing" ]; then
  python3 -c 'import venv, ensurepip' 2>/dev/null && missing=$(echo "$missing" | sed 's/ python3-venv//')
  python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null &&
    missing=$(echo "$missing" | sed 's/ python3-dev//')
fi
[ -n "$(echo "$missing" | tr -d ' ')" ] || exit 0

if [ "$(id -u)" -eq 0 ]; then
  as_root=""
elif command -v sudo >/dev/null 2>&1; then
  as_root="sudo"
else
  echo "installing$missing needs root: run this as root, or install sudo" >&2
  exit 1
fi

echo "installing:$missing"
$as_root apt-get update -qq
# Without an init system (a container, a CI machine) package scripts must not try to start the
# daemons they ship: the tests start their own.
policy=""
if [ ! -d /run/systemd/system ] && [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $as_root tee /usr/sbin/policy-rc.d >/dev/null
  $as_root chmod +x /usr/sbin/policy-rc.d
  policy=1
fi
# shellcheck disable=SC2086 # the package list is meant to split into words
$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
[ -z "$policy" ] || $as_root rm -f /usr/sbin/policy-rc.d
