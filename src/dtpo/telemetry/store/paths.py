"""Where the run store lives and what can go wrong with it: the path a command uses (``--store``,
``$DTPO_STORE``, ``runs/dtpo.sqlite``), the check it runs before it starts, and the store's errors."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.core.files import is_writable_dir

__all__ = ["DEFAULT_STORE", "STORE_ENV", "CorruptStore", "StoreError", "StoreMissing", "check_store_path", "dir_key",
           "now_iso", "reindex_hint", "store_path"]

DEFAULT_STORE = Path("runs") / "dtpo.sqlite"
"""The store of the working directory's project when ``--store`` is not given."""
STORE_ENV = "DTPO_STORE"  # a default store other than DEFAULT_STORE (a team's shared one; the test suite's own)
SQLITE_HEADER = b"SQLite format 3\x00"


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


def check_store_path(path: str | os.PathLike[str] | None) -> Path:
    """Refuse a store path that cannot work, creating nothing: the check a command runs before it starts.

    Returns:
        The store's absolute path.

    Raises:
        StoreError: The path is a directory, lies under a file, or its folder (or the nearest one that exists)
            cannot be written in (SQLite keeps its lock and WAL files next to the database).
        CorruptStore: The file exists but is not a SQLite database.
    """
    target = store_path(path)
    if target.is_dir():
        raise StoreError(f"run store {target} is a directory; --store must name a file, e.g. {target / 'dtpo.sqlite'}")
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise StoreError(f"run store {target} lies under the file {parent}; --store must name a file in a folder")
        if parent.is_dir():
            if not is_writable_dir(parent):
                raise StoreError(f"run store {target}: cannot write in folder {parent}; choose another with --store")
            break
    if target.is_file():
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
