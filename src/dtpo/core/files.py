"""Small file-system facts every layer asks about."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

RUN_ROOT_ENV = "DTPO_RUN_ROOT"


def default_run_root() -> Path:
    """Where new run directories go when none is named: ``$DTPO_RUN_ROOT``, else ``runs`` in the working
    directory."""
    return Path(os.environ.get(RUN_ROOT_ENV) or "runs")


def is_writable_dir(path: Path) -> bool:
    """Whether a file can really be created in ``path`` (permission bits lie for root and read-only mounts)."""
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".dtpo-probe-"):
            return True
    except OSError:
        return False


def untrusted_reason(path: Path) -> str | None:
    """Why ``path`` cannot be trusted to hold what dtpo loads and runs as this user, or ``None`` when it can.

    As OpenSSH does with its files: the path and every folder above it must belong to this user or root and must
    not be writable by group or others (a folder with the sticky bit, such as ``/tmp``, may be, as long as the
    path below it is this user's). Otherwise another user could plant what dtpo loads.
    """
    uid = os.geteuid()
    current = path.resolve()
    first = True
    for part in (current, *current.parents):
        try:
            st = part.stat()
        except OSError as exc:
            return f"{part} cannot be inspected ({exc.strerror or exc})"
        if st.st_uid not in (uid, 0):
            return f"{part} belongs to another user (uid {st.st_uid})"
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and (first or not sticky):
            return f"{part} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'}"
        first = False
    return None
