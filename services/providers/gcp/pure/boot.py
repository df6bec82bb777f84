"""Which metadata key an image runs, and the user data as the guest agent's startup-script.

Google's images boot one of two ways (docs/decisions/0140-gcp-images-as-they-boot.md): the
Ubuntu and Container-Optimized OS images run cloud-init, which reads the ``user-data`` key (a
MIME multipart document: shell parts, ``#cloud-config`` parts); the Debian, RHEL-family and SUSE
images have no cloud-init, and Google's guest agent runs the ``startup-script`` key, one shell
script, on every boot. A VM given the wrong key comes up Running with an address and no Squid.

So the key follows the image's project: a table of Google's public image projects, and both keys
for any other image (a custom image may have either). The startup-script is the user data's shell
parts run in name order, as cloud-init runs them: once per VM (a marker written on success, so a
failed first boot is retried at the next one) and, when ``user-data`` is sent too, not at all on
an image where cloud-init is installed (cloud-init runs them there; running both would run each
part twice, concurrently). A part the guest agent cannot run (``#cloud-config``, a boothook, an
include) is reported, never silently dropped. Pure: nothing is read or run here.
"""

from __future__ import annotations

import email.parser
import email.policy
import enum
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

USER_DATA = "user-data"
"""What cloud-init's GCE datasource reads."""
STARTUP_SCRIPT = "startup-script"
"""What Google's guest agent runs, on every boot."""
STATE_DIR = "/var/lib/egress-proxies-startup"
"""Root's own: not the lease helper's state directory, which Squid's user owns."""
DONE_FILE = "startup-script.done"
SHELL = "shell script"


class Boot(enum.Enum):
    """How an image runs what it is given at first boot."""

    CLOUD_INIT = "cloud-init"
    GUEST_AGENT = "guest agent only"
    UNKNOWN = "unknown"


CLOUD_INIT_PROJECTS = frozenset(
    {"ubuntu-os-cloud", "ubuntu-os-pro-cloud", "ubuntu-os-accelerator-images", "cos-cloud"}
)
"""Google's public image projects whose images ship cloud-init."""
GUEST_AGENT_PROJECTS = frozenset(
    {
        "debian-cloud",
        "centos-cloud",
        "rocky-linux-cloud",
        "rhel-cloud",
        "rhel-sap-cloud",
        "almalinux-cloud",
        "suse-cloud",
        "suse-sap-cloud",
        "opensuse-cloud",
    }
)
"""Google's public image projects whose images have the guest agent and no cloud-init."""

_IMAGE_PROJECT = re.compile(r"(?:^|/)projects/([a-z0-9.:-]+)/global/images/")


def image_project(image: str) -> str:
    """The project an image path names (``projects/debian-cloud/global/images/...`` or its URL),
    or ``""`` for one in the VMs' own project (``global/images/x``) or a malformed path."""
    match = _IMAGE_PROJECT.search(image)
    return match.group(1) if match else ""


def boot_of(image: str) -> Boot:
    project = image_project(image)
    if project in CLOUD_INIT_PROJECTS:
        return Boot.CLOUD_INIT
    if project in GUEST_AGENT_PROJECTS:
        return Boot.GUEST_AGENT
    return Boot.UNKNOWN


def keys_for(boot: Boot) -> tuple[str, ...]:
    """The metadata keys that carry the script for an image booting as ``boot``."""
    if boot is Boot.CLOUD_INIT:
        return (USER_DATA,)
    if boot is Boot.GUEST_AGENT:
        return (STARTUP_SCRIPT,)
    return (USER_DATA, STARTUP_SCRIPT)


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the user data: its name (the file name cloud-init gives it), what it is
    (``shell script``, ``#cloud-config``, ...) and its text."""

    name: str
    kind: str
    content: str


_CONTENT_TYPES = {
    "text/cloud-config": "#cloud-config",
    "text/cloud-boothook": "#cloud-boothook",
    "text/x-include-url": "#include",
    "text/x-include-once-url": "#include-once",
    "text/part-handler": "#part-handler",
    "text/jinja2": "## template: jinja",
    "text/cloud-config-archive": "#cloud-config-archive",
}
_FIRST_LINES = (
    "#cloud-config-archive",
    "#cloud-config",
    "#cloud-boothook",
    "#include-once",
    "#include",
    "#part-handler",
    "## template: jinja",
)


def _kind(content_type: str, content: str) -> str:
    """What cloud-init would take a part for: its content type, else its first line."""
    if content_type.startswith("text/x-shellscript"):
        return SHELL
    if content_type in _CONTENT_TYPES:
        return _CONTENT_TYPES[content_type]
    if not content_type.startswith("text/"):
        return content_type
    head = content.lstrip()
    if head.startswith("#!"):
        return SHELL
    for first in _FIRST_LINES:
        if head.startswith(first):
            return first
    return f"{content_type} without a #! line"


def parts(user_data: str) -> list[Part]:
    """The parts of ``user_data`` as cloud-init sees them: each leaf of a MIME multipart
    document (named by its filename, else ``part-NNN``), or the whole as one part."""
    if not user_data.strip():
        return []
    head = user_data.lstrip()[:200].lower()
    if head.startswith(("content-type: multipart", "mime-version:")):
        message = email.parser.Parser(policy=email.policy.default).parsestr(user_data)
        if message.is_multipart():
            found: list[Part] = []
            for number, leaf in enumerate(message.walk()):
                if leaf.is_multipart():
                    continue
                payload = leaf.get_payload(decode=True)
                raw = payload if isinstance(payload, bytes) else b""
                content = raw.decode(leaf.get_content_charset() or "utf-8", errors="replace")
                name = leaf.get_filename() or f"part-{number:03d}"
                found.append(Part(name, _kind(leaf.get_content_type(), content), content))
            return found
    return [Part("part-001", _kind("text/plain", user_data), user_data)]


def not_run(found: Sequence[Part]) -> list[Part]:
    """The parts the guest agent cannot run: everything but shell scripts."""
    return [part for part in found if part.kind != SHELL]


def startup_script(user_data: str, *, with_user_data: bool) -> str:
    """The startup-script equivalent of ``user_data``: its shell parts, in name order (as
    cloud-init's ``scripts-user`` runs them), each written out byte for byte and executed (its
    own ``#!`` line decides the interpreter); every part runs even if one before failed, and the
    marker is written only when all succeeded. ``with_user_data``: the VM gets ``user-data``
    too, so the script stands aside where cloud-init is installed."""
    found = parts(user_data)
    runnable = {part.name: part for part in found if part.kind == SHELL}  # a repeated name: last
    skipped = not_run(found)
    lines = [
        "#!/bin/sh",
        "# egress-proxies: the Proxy's user data as the guest agent runs it: its shell parts in",
        "# name order, once per VM (docs/decisions/0140-gcp-images-as-they-boot.md)",
        "set -u",
        f"state={STATE_DIR}",
        f'if [ -e "$state/{DONE_FILE}" ]; then',
        '  echo "egress-proxies: the user data already ran on this VM"',
        "  exit 0",
        "fi",
    ]
    if with_user_data:
        lines += [
            "if command -v cloud-init >/dev/null 2>&1; then",
            '  echo "egress-proxies: cloud-init runs the user-data on this image"',
            "  exit 0",
            "fi",
        ]
    for part in skipped:
        note = f"egress-proxies: part {part.name} ({part.kind}) needs cloud-init; not run"
        lines.append(f"echo {shlex.quote(note)} >&2")
    lines += ["dir=$(mktemp -d) || exit 1", "trap 'rm -rf \"$dir\"' EXIT", "failed=0"]
    for number, name in enumerate(sorted(runnable), start=1):
        content = runnable[name].content
        if not content.endswith("\n"):
            content += "\n"
        end = _marker(number, content)
        path = f'"$dir/{number:03d}"'
        failure = shlex.quote(f"egress-proxies: part {name} failed")
        lines += [
            f"cat > {path} <<'{end}'",
            content + end,
            f"chmod 0700 {path}",
            f"{path} || {{ echo {failure} >&2; failed=1; }}",
        ]
    lines += [
        'if [ "$failed" = 0 ]; then',
        f'  mkdir -p "$state" && touch "$state/{DONE_FILE}"',
        "fi",
        'exit "$failed"',
    ]
    return "\n".join(lines) + "\n"


def _marker(number: int, content: str) -> str:
    """A here-document end line that no line of ``content`` equals."""
    end = f"EGRESS_PART_{number}_EOF"
    taken = set(content.splitlines())
    while end in taken:
        end += "_"
    return end
