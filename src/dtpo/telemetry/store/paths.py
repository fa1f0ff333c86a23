"""Where the run store lives and what can go wrong with it: the path a command uses (``--store``,
``$DTPO_STORE``, ``runs/dtpo.sqlite``), the check it runs before it starts, who may read and write it, and the
store's errors.

A store on a shared file system is as private or as shared as its file mode says: dtpo never changes the mode
of a store, and the files SQLite makes beside it (``-wal``, ``-shm``) take the store's mode. A user who may
write the store (and the files beside it) uses it as its owner does; one who may only read it gets the reading
commands, which then open it without locks and create nothing (:func:`write_problem`); one who may not read it
gets one line saying whose it is and what to do.
"""

from __future__ import annotations

import datetime as _dt
import grp
import logging
import os
import pwd
import stat
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.core.files import is_writable_dir

__all__ = ["DEFAULT_STORE", "SIBLINGS", "STORE_ENV", "CorruptStore", "StoreError", "StoreMissing", "check_store_path",
           "dir_key", "now_iso", "reindex_hint", "store_path", "write_problem"]

log = logging.getLogger(__name__)

DEFAULT_STORE = Path("runs") / "dtpo.sqlite"
"""The store of the working directory's project when ``--store`` is not given."""
STORE_ENV = "DTPO_STORE"  # a default store other than DEFAULT_STORE (a team's shared one; the test suite's own)
SQLITE_HEADER = b"SQLite format 3\x00"
SIBLINGS = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside the database while it is in use: a writer must be able to write each that exists."""


class StoreError(ConfigError):
    """The run store cannot be used: a bad path, a lock held too long, an unknown or ambiguous run id."""


class CorruptStore(StoreError):
    """The store's file is not a readable dtpo run store; ``dtpo runs reindex`` rebuilds it."""


class StoreMissing(StoreError):
    """No store exists at the path yet (reading commands do not create one)."""


def now_iso(precise: bool = False) -> str:
    """The current UTC time, ISO-8601, to the second (or to the microsecond)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds" if precise else "seconds")


def store_path(path: str | os.PathLike[str] | None) -> Path:
    """The absolute path of a store: ``path``, else ``$DTPO_STORE``, else :data:`DEFAULT_STORE` under the working
    directory.

    Raises:
        StoreError: ``path`` is an empty string.
    """
    if path is None:
        return Path(os.environ[STORE_ENV]).expanduser().absolute() if os.environ.get(STORE_ENV) else \
            DEFAULT_STORE.absolute()
    if not str(path).strip():
        raise StoreError("--store must name a file, got an empty string")
    return Path(path).expanduser().absolute()


def dir_key(path: str | os.PathLike[str]) -> str:
    """How the store names a run directory: its absolute path, symbolic links resolved."""
    return str(Path(path).expanduser().resolve())


def reindex_hint(path: Path) -> str:
    """The command that rebuilds the store at ``path``."""
    return "`dtpo runs reindex" + ("" if path == store_path(None) else f" --store {path}") + "`"


def check_store_path(path: str | os.PathLike[str] | None, write: bool = True) -> Path:
    """Refuse a store path that cannot work, creating nothing: the check a command runs before it starts.

    Args:
        path: ``--store`` (``None``: the default store).
        write: Whether the command writes the store (every command but ``dtpo runs list``, ``show``, ``compare``
            and ``export``, which only need to read it).

    Returns:
        The store's absolute path.

    Raises:
        StoreError: The path is a directory or lies under a file; the store cannot be read; with ``write``, its
            folder (or the nearest one that exists) cannot be written in (SQLite keeps its lock and WAL files next
            to the database), or the store or a file SQLite keeps beside it cannot be written by this user.
        CorruptStore: The file exists but is not a SQLite database.
    """
    target = store_path(path)
    if target.is_dir():
        raise StoreError(f"run store {target} is a directory; --store must name a file, e.g. {target / 'dtpo.sqlite'}")
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise StoreError(f"run store {target} lies under the file {parent}; --store must name a file in a folder")
        if parent.is_dir():
            if write and not target.exists() and not is_writable_dir(parent):  # else write_problem says
                raise StoreError(f"run store {target}: cannot write in folder {parent}; choose another with --store")
            break
    if target.is_file():
        if not os.access(target, os.R_OK):
            raise StoreError(f"run store {_whose(target)}: this user cannot read it; {_fix(target)}")
        if write:
            why = write_problem(target)
            if why is not None:
                raise StoreError(f"run store {why}")
            _warn_if_shared_without_setgid(target)
        try:
            with target.open("rb") as fh:
                head = fh.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise StoreError(f"run store {target} cannot be read ({exc.strerror or exc})") from None
        if head and head != SQLITE_HEADER:
            raise CorruptStore(f"run store {target} is corrupt (not a SQLite database); {reindex_hint(target)} "
                               "rebuilds it from the run directories")
    elif target.exists():
        raise StoreError(f"run store {target} is not a regular file")
    return target


def write_problem(target: Path) -> str | None:
    """Why this user cannot write the existing store ``target``, or ``None`` when it can.

    The kernel decides (``os.access``: the mode bits, the user's groups, ACLs, root), for the database, each file
    SQLite keeps beside it that exists now, and the folder. The answer is one clause with what to do, e.g.
    ``/shared/dtpo.sqlite belongs to alice (uid 1001) with mode 0644: this user can read it but not write it; ask
    its owner ...``.
    """
    if not os.access(target, os.R_OK | os.W_OK):
        can = "can read it but not write it" if os.access(target, os.R_OK) else "can neither read nor write it"
        return f"{_whose(target)}: this user {can}; {_fix(target)}"
    for suffix in SIBLINGS:
        sibling = Path(f"{target}{suffix}")
        if sibling.exists() and not os.access(sibling, os.R_OK | os.W_OK):
            return (f"{target}: {_whose(sibling)}, so this user cannot write the store while that file is there "
                    "(another user's run has the store open, or left it behind); chmod g+s on the folder gives such "
                    "files the store's group")
    if not is_writable_dir(target.parent):
        return f"{target}: this user cannot write in its folder {target.parent}; choose another with --store"
    return None


def _fix(target: Path) -> str:
    """What to do about a store this user cannot read or write: its own (chmod), or another user's (share it)."""
    try:
        mine = target.stat().st_uid == os.geteuid()
    except OSError:
        mine = False
    if mine:
        return f"chmod u+rw {target}, or use another store with --store"
    return (f"ask its owner to share it with your group (chgrp GROUP {target} && chmod 660 {target}, and chmod g+s "
            "on its folder), or use a store of your own with --store")


def _whose(path: Path) -> str:
    """``PATH belongs to alice (uid 1001) with mode 0644`` (``PATH has mode 0444`` for this user's own)."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror or exc})"
    mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if st.st_uid == os.geteuid():
        return f"{path} has {mode}"
    return f"{path} belongs to {_user_name(st.st_uid)} with {mode}"


def _user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _warn_if_shared_without_setgid(target: Path) -> None:
    """Warn when a store another user owns is shared through its group but its folder lacks the setgid bit: the
    ``-wal`` and ``-shm`` files SQLite makes while this user writes then get this user's own group, and the
    store's other users cannot open the store until they are gone."""
    try:
        st, folder = target.stat(), target.parent.stat()
    except OSError:
        return
    shared = st.st_uid != os.geteuid() and st.st_mode & stat.S_IWGRP
    if shared and not folder.st_mode & stat.S_ISGID and st.st_gid != os.getegid():
        log.warning("run store %s is shared through its group %s, but its folder lacks the setgid bit: the files "
                    "SQLite keeps beside it while this user writes get this user's group, and others cannot open the "
                    "store meanwhile; fix: chgrp %s %s && chmod g+s %s", target, _group_name(st.st_gid),
                    _group_name(st.st_gid), target.parent, target.parent)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
