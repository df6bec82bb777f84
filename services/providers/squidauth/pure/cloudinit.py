"""Lease enforcement for VM proxies (gcp, kvm), as one more part of the Proxy's cloud-init.

A VM's Squid is the image's own, installed and configured by the Proxy's cloud-init; we add a
shell-script part that writes the helper, the proxy key and a ``conf.d`` snippet, then restarts
Squid. The user's cloud-init stays a part of its own, untouched: a ``#cloud-config`` part merged
with ours could lose its ``write_files`` or ``runcmd`` to cloud-init's list merging, a separate
script cannot. User data that is already MIME multipart gets our part appended.

cloud-init runs script parts in the final stage, after ``packages:`` are installed, in name
order (ours sorts last). The snippet is for Debian's and Ubuntu's Squid, whose ``squid.conf``
includes ``/etc/squid/conf.d/*.conf`` before its own ``http_access`` rules, and it is named to
come first there, so its ``deny`` precedes any ``allow`` of the user's (docs/providers.md).
Pure: the helper's source and the key are passed in.
"""

from __future__ import annotations

import email.parser
import email.policy
from email.message import EmailMessage, Message

from services.providers.pure.squidconf import SquidAuth, auth_lines

HELPER_PATH = "/usr/local/lib/egress-proxies/squid-lease-auth.py"
KEY_PATH = "/etc/squid/egress-lease.key"
STATE_DIR = "/var/lib/egress-proxies"
SNIPPET_PATH = "/etc/squid/conf.d/00-egress-lease.conf"
PART_NAME = "zz-egress-lease.sh"
_END = "EGRESS_LEASE_EOF"


def vm_squid_auth(fence_floor: int = 0) -> SquidAuth:
    """``fence_floor``: the proxy's highest granted token at create (D92); the helper refuses
    lower ones from the VM's first request."""
    return SquidAuth(
        program=f"/usr/bin/python3 {HELPER_PATH} --key-file {KEY_PATH} "
        f"--state-file {STATE_DIR}/fence",
        fence_floor=fence_floor,
    )


def lease_script(key_hex: str, helper: str, fence_floor: int = 0) -> str:
    """The script part: idempotent (a re-run writes the same files), and it never prints the
    key (cloud-init logs a script's output). The key is readable by the helper's user only,
    Squid's (owner, mode 0400): no other user of the VM can mint credentials (D134)."""
    if _END in helper:
        raise ValueError(f"the helper source contains the heredoc end marker {_END}")
    snippet = "\n".join(auth_lines(vm_squid_auth(fence_floor)))
    return f"""#!/bin/sh
# egress-proxies: only the holder of a current lease may use this proxy
# (docs/decisions/0084-leases-enforced-at-the-proxy.md)
set -eu
user=proxy
id -u proxy >/dev/null 2>&1 || user=squid
umask 022
mkdir -p /usr/local/lib/egress-proxies /etc/squid/conf.d
install -d -m 0700 -o "$user" {STATE_DIR}
cat > {HELPER_PATH} <<'{_END}'
{helper.rstrip()}
{_END}
chmod 0755 {HELPER_PATH}
umask 077
rm -f {KEY_PATH}
printf '%s\\n' '{key_hex}' > {KEY_PATH}
chown "$user:$(id -gn "$user")" {KEY_PATH}
chmod 0400 {KEY_PATH}
umask 022
cat > {SNIPPET_PATH} <<'{_END}'
{snippet}
{_END}
if command -v systemctl >/dev/null 2>&1 && systemctl cat squid >/dev/null 2>&1; then
  systemctl restart squid
fi
"""


def with_lease_auth(user_data: str, key_hex: str, helper: str, fence_floor: int = 0) -> str:
    """``user_data`` plus the lease part, as MIME multipart user data."""
    return with_script_part(user_data, lease_script(key_hex, helper, fence_floor), PART_NAME)


def with_script_part(user_data: str, script: str, filename: str) -> str:
    """``user_data`` plus one shell-script part named ``filename``, as MIME multipart user data
    (multipart user data gets the part appended; other user data becomes the first part)."""
    ours = EmailMessage()
    ours.set_content(script, subtype="x-shellscript")
    ours.add_header("Content-Disposition", "attachment", filename=filename)
    head = user_data.lstrip()[:200].lower()
    if head.startswith(("content-type: multipart", "mime-version:")):
        parsed = email.parser.Parser(policy=email.policy.default).parsestr(user_data)
        if parsed.is_multipart():
            parsed.attach(ours)
            return _text(parsed)
    message = EmailMessage()
    message.make_mixed()
    if user_data.strip():
        theirs = EmailMessage()
        # text/plain: cloud-init tells the part's type from its first line, as it would have.
        # ASCII stays as written (no quoted-printable soft breaks splitting a long line, so
        # a wire log's redaction still sees each token whole); other text is encoded.
        cte = "8bit" if user_data.isascii() else None
        theirs.set_content(user_data, subtype="plain", cte=cte)
        theirs.add_header("Content-Disposition", "attachment", filename="part-001")
        message.attach(theirs)
    message.attach(ours)
    return _text(message)


def _text(message: Message) -> str:
    return message.as_string(policy=email.policy.SMTP.clone(linesep="\n"))
