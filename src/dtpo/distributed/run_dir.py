"""Run directories: chosen, created and checked before any process starts, never overwriting a record.

``dtpo launch``, ``dtpo train`` and ``dtpo bench`` all call :func:`prepare_run_dir`, so a bad ``--run-dir`` (a
file, a path under a file, a read-only directory, an empty string) ends in one line naming the flag before a
worker exists, and a directory that already holds a run's record is refused unless ``--overwrite`` is given.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from dtpo.core.errors import ConfigError
from dtpo.core.files import default_run_root, is_writable_dir
from dtpo.core.record import RANK_DIR, RECORD_FILE, new_run_id

log = logging.getLogger(__name__)

LAUNCHER_LOG = "launcher.log"


def prepare_run_dir(path: Path | str | None, overwrite: bool = False, default_root: Path | None = None) -> Path:
    """Resolve, create and check a run directory.

    Args:
        path: The directory the user named (``--run-dir``), or ``None`` for ``default_root/<new run id>``.
        overwrite: Allow a directory that already holds a run's record; the old record and rank files go.
        default_root: Parent of new run directories when ``path`` is ``None`` (default: ``$DTPO_RUN_ROOT``, else
            ``runs``).

    Returns:
        The absolute path of the directory, which exists and is writable.

    Raises:
        ConfigError: The path is empty, is or lies under a file, cannot be created or written, or holds a
            record and ``overwrite`` is false. Nothing is left behind.
    """
    if path is None:
        path = Path(default_root if default_root is not None else default_run_root()) / new_run_id()
    if isinstance(path, str) and not path.strip():
        raise ConfigError("--run-dir must name a directory, got an empty string")
    target = Path(path).expanduser().absolute()
    for parent in (target, *target.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == target else f"lies under the file {parent}"
            raise ConfigError(f"--run-dir {path} {where}, not a directory")
    if target.is_dir() and holds_record(target):
        if not overwrite:
            found = target / RECORD_FILE if (target / RECORD_FILE).exists() else target / RANK_DIR
            raise ConfigError(f"--run-dir {path} already holds a run record ({found}); choose a new directory "
                              "or pass --overwrite")
        _clear_record(target)
    created = _missing_ancestors(target)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_created(created)
        raise ConfigError(f"--run-dir {path}: cannot create it ({exc.strerror or exc})") from None
    if not is_writable_dir(target):
        _remove_created(created)
        raise ConfigError(f"--run-dir {path} is not writable")
    return target.resolve()


def holds_record(path: Path) -> bool:
    """Whether ``path`` holds a run's record or any rank's partial record."""
    ranks = path / RANK_DIR
    return (path / RECORD_FILE).exists() or (ranks.is_dir() and any(ranks.iterdir()))




def is_empty_run(path: Path) -> bool:
    """Whether a run directory holds nothing a run wrote besides the launcher's own log."""
    if not path.is_dir():
        return True
    return all(child.name == LAUNCHER_LOG or (child.is_dir() and not any(child.rglob("*")))
               for child in path.iterdir())


def remove_empty_run(path: Path) -> bool:
    """Remove a run directory that holds nothing (see :func:`is_empty_run`).

    Returns:
        True when the directory was removed.
    """
    if not path.is_dir() or not is_empty_run(path):
        return False
    try:
        shutil.rmtree(path)
    except OSError as exc:
        log.warning("could not remove the empty run directory %s: %s", path, exc.strerror or exc)
        return False
    return True


def _clear_record(path: Path) -> None:
    """What ``--overwrite`` replaces: the earlier run's record and its rank files (nothing else in the folder)."""
    try:
        (path / RECORD_FILE).unlink(missing_ok=True)
        if (path / RANK_DIR).is_dir():
            shutil.rmtree(path / RANK_DIR)
    except OSError as exc:
        raise ConfigError(f"--run-dir {path}: cannot replace the earlier record ({exc.strerror or exc})") from None
    log.info("--overwrite: replacing the earlier record in %s", path)


def _missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first."""
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    return missing


def _remove_created(created: list[Path]) -> None:
    for folder in created:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            return
