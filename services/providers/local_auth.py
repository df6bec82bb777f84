"""The local provider's side of leases enforced at the proxy
(docs/decisions/0084-leases-enforced-at-the-proxy.md): where the Squid helper, the proxy's key and
the helper's fencing state live, and how Squid runs the helper.

Squid started as root drops to an unprivileged user before it starts its helpers, so they must
be reachable by that user: in the instance directory when its parents let that user through, in
a directory of their own under the temporary directory otherwise (a data dir under a private
home). The helper runs under a Python that user can run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from services.providers.base import LeaseAuth, Permanent
from services.providers.pure.squidconf import SquidAuth
from services.providers.squidauth.helper import Fence

KEY_FILE = "lease.key"
HELPER_FILE = "lease-auth.py"
FENCE_FILE = "lease-fence"
AUTH_DIR_SUFFIX = "-lease"


def own_dir(service: str) -> Path:
    """The directory of its own an instance's helper gets (``service``: its Squid's name)."""
    return Path(tempfile.gettempdir()) / f"{service}{AUTH_DIR_SUFFIX}"


def remove_own_dir(service: str) -> None:
    path = own_dir(service)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)


def write_key(instance_dir: Path, auth: LeaseAuth) -> None:
    """The key where the proxy.py plugin reads it (proxy.py runs as us), and its fencing
    state raised to the floor (the plugin has no command line to take ``--fence-floor``)."""
    write_private(instance_dir / KEY_FILE, f"{auth.key}\n".encode(), None)
    raise_fence(instance_dir / FENCE_FILE, auth.fence_floor)


def raise_fence(path: Path, floor: int) -> None:
    """The fencing state at ``floor`` at least; a higher token already recorded stays (D92)."""
    if floor <= 0:
        return
    Fence(str(path), floor).admit(floor)


def _runnable_by_all(path: str) -> bool:
    """Whether any user may run ``path``: it and every directory above it are world-executable
    (Squid drops root before it starts its helpers)."""
    real = Path(os.path.realpath(path))
    try:
        if not real.stat().st_mode & stat.S_IXOTH:
            return False
        return all(parent.stat().st_mode & stat.S_IXOTH for parent in real.parents)
    except OSError:
        return False


def helper_interpreter(user: str | None) -> str:
    """The Python that runs the lease helper: ours, unless Squid drops to ``user``, who may not
    reach it (a virtualenv under root's home); then a system one."""
    if user is None:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if _runnable_by_all(candidate):
            return candidate
    raise Permanent(
        f"the lease helper needs a python3 that Squid's user {user!r} can run; install python3 "
        "(e.g. /usr/bin/python3), or give the provider `auth: none`"
    )


def write_private(path: Path, data: bytes, user: str | None, *, mode: int = 0o600) -> None:
    """Atomically, a file only its owner (Squid's user, when we drop to one) can read, unless
    ``mode`` says otherwise."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(tmp, entry.pw_uid, entry.pw_gid)
    os.replace(tmp, path)


def auth_dir(instance_dir: Path, user: str | None, service: str) -> Path:
    """Where the helper, the key and the fencing state live: the instance directory, unless
    Squid drops to ``user`` and that user cannot reach it (a data dir under a private one);
    then a directory of its own in the temporary directory, named after the instance."""
    if user is None or _runnable_by_all(str(instance_dir.parent)):
        return instance_dir
    return own_dir(service)


def own_dir_for(path: Path, user: str) -> None:
    """``path``, made for ``user`` alone; one that someone else made first is refused rather
    than trusted (the temporary directory is shared)."""
    entry = pwd.getpwnam(user)
    try:
        os.mkdir(path, 0o700)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    except FileExistsError:
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != entry.pw_uid:
            raise Permanent(
                f"{path} exists and is not a directory of {user!r}; remove it and create again"
            ) from None


def prepare_auth(instance_dir: Path, auth: LeaseAuth, user: str | None, service: str) -> SquidAuth:
    """The helper, this proxy's key, and how Squid runs the one with the other. The fencing
    state is the helper's own file, kept across restarts of the instance's Squid; the helper
    starts it at the request's fence floor (``--fence-floor``, D92)."""
    where = auth_dir(instance_dir, user, service)
    if any(c.isspace() for c in str(where)):
        raise Permanent(
            f"{where}: Squid cannot run a helper from a path with spaces; use a dataDir "
            "without spaces, or give the provider `auth: none`"
        )
    if where != instance_dir and user is not None:
        own_dir_for(where, user)
    python = helper_interpreter(user)
    write_private(where / HELPER_FILE, auth.helper.encode(), None, mode=0o644)
    write_private(where / KEY_FILE, f"{auth.key}\n".encode(), user)
    # --instance names the instance directory on the helper's command line, so its processes
    # are recognised as the instance's (``_ours``) wherever the helper lives.
    program = (
        f"{python} {where / HELPER_FILE} --key-file {where / KEY_FILE} "
        f"--state-file {where / FENCE_FILE} --instance {instance_dir}{os.sep}"
    )
    return SquidAuth(program=program, fence_floor=auth.fence_floor)
