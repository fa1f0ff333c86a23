"""Registering the commands' runs in the run store (:mod:`dtpo.telemetry.store.database`).

``dtpo train`` and ``dtpo bench`` register a run as ``running`` before it starts (a store that cannot be
opened stops the command there, exit 2) and record how it ended when it ends, whatever ended it
(:func:`registered`). ``dtpo simulate`` and ``dtpo plan`` check the store and their run directory before they
compute, then write their result into ``runs/simulate-<id>/simulate.json`` or ``runs/plan-<id>/plan.json`` and
register it (:func:`save_result`).

A registration that fails at the end of a run never costs the run: the JSON in its run directory is the
source of truth, a warning names ``dtpo runs reindex``, and the command keeps its exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from dtpo.core.errors import ConfigError, DtpoError, first_line
from dtpo.core.files import default_run_root
from dtpo.core.record import RunRecord, new_run_id, write_json_atomic
from dtpo.distributed.run_dir import holds_record, prepare_run_dir, remove_empty_run
from dtpo.telemetry.store.database import RunStore
from dtpo.telemetry.store.figures import result_facts
from dtpo.telemetry.store.paths import check_store_path, now_iso, reindex_hint

log = logging.getLogger(__name__)

RESULT_FILE = {"simulate": "simulate.json", "plan": "plan.json"}


def _status_of(error: BaseException | None) -> str:
    """``interrupted`` for an interrupt (SIGINT, SIGTERM), else ``failed``."""
    code = getattr(error, "exit_code", None)
    if isinstance(error, KeyboardInterrupt) or type(error).__name__ == "Abort" or code in (130, 143):
        return "interrupted"
    return "failed"


def warn_unregistered(store: Path, what: str, run_dir: Path, exc: BaseException) -> None:
    """The warning of a run whose row could not be written: its run directory still holds it."""
    log.warning("%s could not be registered in the run store %s (%s); its result is safe in %s, and %s adds it",
                what, store, first_line(str(exc)) or type(exc).__name__, run_dir, reindex_hint(store))


@dataclass
class Registration:
    """A run registered as ``running``: set ``record`` (train) or ``result`` (bench) before it ends.

    Attributes:
        store: The store.
        id: The run's id in the store.
        kind: ``train``, ``tune`` or ``bench``.
        run_dir: Its run directory.
        parent: The bench it belongs to, if any.
        record: The run's final record, once concluded.
        result: A bench's ``bench.json`` content, once written.
    """

    store: RunStore
    id: str
    kind: str
    run_dir: Path
    parent: str | None = None
    record: RunRecord | None = None
    result: dict[str, Any] | None = None

    def conclude(self, error: BaseException | None = None) -> None:
        """Write how the run ended: from its record or result when it has one, else ``failed`` or
        ``interrupted`` with ``error``'s one line. Never raises: a failure is a warning."""
        try:
            if self.record is not None:
                self.store.register_record(self.record, self.run_dir, kind=self.kind, parent=self.parent)
            elif self.result is not None:
                status = "completed" if error is None else _status_of(error)
                message = None if error is None else first_line(str(error)) or type(error).__name__
                self.store.register_result(self.kind, self.run_dir, result_facts(self.kind, self.result),
                                           status=status, parent=self.parent, error=message)
            else:
                message = first_line(str(error)) if error is not None else ""
                self.store.finish(self.id, _status_of(error),
                                  error=message or (type(error).__name__ if error else "the run recorded nothing"))
        except (DtpoError, sqlite3.Error, OSError) as exc:
            warn_unregistered(self.store.path, f"run {self.id}", self.run_dir, exc)


@contextlib.contextmanager
def registered(store: RunStore, kind: str, run_dir: Path, config: dict[str, Any],
               parent: str | None = None) -> Iterator[Registration]:
    """Register a run as ``running`` for the ``with`` block and record how it ended after it.

    Raises:
        StoreError: The row cannot be written at the start (the run has not started: a one-line error; the
            still empty run directory is removed).
    """
    try:
        run_id = store.register(run_dir.name, kind, run_dir, config, parent=parent)
    except DtpoError:
        remove_empty_run(run_dir)
        raise
    registration = Registration(store, run_id, kind, run_dir, parent)
    try:
        yield registration
    except BaseException as exc:
        registration.conclude(exc)
        raise
    registration.conclude()


def register_record(record: RunRecord, run_dir: Path, store: str | None = None) -> None:
    """Add a finished run (``dtpo launch``'s) to the run store; a failure is a warning naming ``dtpo runs reindex``:
    the record stays in its run directory."""
    try:
        RunStore.open(store).register_record(record, run_dir)
    except (DtpoError, sqlite3.Error, OSError) as exc:
        warn_unregistered(check_store_path_quietly(store), f"run {run_dir.name}", run_dir, exc)


def open_store_for(run_dir: Path, store: str | None) -> RunStore:
    """Open the store for a run whose directory was just prepared; if it cannot be opened, remove the (still
    empty) run directory and raise the one-line error, before anything ran."""
    try:
        return RunStore.open(store)
    except DtpoError:
        remove_empty_run(run_dir)
        raise


# -- simulate and plan ----------------------------------------------------------------------------------------------

def check_result_target(kind: str, run_dir: Path | None, store: str | None) -> None:
    """Refuse an unusable ``--run-dir`` or ``--store`` of ``dtpo simulate`` / ``dtpo plan`` before it computes,
    creating nothing.

    Raises:
        ConfigError: One line naming the flag.
    """
    check_store_path(store)
    if run_dir is None:
        return
    if not str(run_dir).strip():
        raise ConfigError("--run-dir must name a directory, got an empty string")
    target = Path(run_dir).expanduser().absolute()
    for parent in (target, *target.parents):
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == target else f"lies under the file {parent}"
            raise ConfigError(f"--run-dir {run_dir} {where}, not a directory")
    if (target / RESULT_FILE[kind]).exists() or target.is_dir() and holds_record(target):
        raise ConfigError(f"--run-dir {run_dir} already holds a result; choose a new directory")
    folder = next(p for p in (target, *target.parents) if p.exists())
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--run-dir {run_dir}: cannot write in folder {folder}")


def save_result(kind: str, data: dict[str, Any], run_dir: Path | None, store: str | None, started_at: str,
                console: Console) -> Path:
    """Write a ``simulate`` or ``plan`` result into its run directory and register it; print where it went.

    Args:
        kind: ``simulate`` or ``plan``.
        data: The result, the same JSON ``--json`` writes.
        run_dir: ``--run-dir``, or ``None`` for ``runs/KIND-<run id>``.
        store: ``--store``, or ``None`` for the default store.
        started_at: When the command started (ISO).
        console: Where to print the line naming the file.

    Returns:
        The path of the JSON file.
    """
    folder = prepare_run_dir(run_dir if run_dir is not None else default_run_root() / f"{kind}-{new_run_id()}")
    path = folder / RESULT_FILE[kind]
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise ConfigError(f"--run-dir {folder}: cannot write {path.name} ({exc.strerror or exc})") from None
    console.print(f"{kind} result: {path}", markup=False, highlight=False, soft_wrap=True)
    try:
        RunStore.open(store).register_result(kind, folder, result_facts(kind, data), started_at=started_at,
                                             finished_at=now_iso())
    except (DtpoError, sqlite3.Error, OSError) as exc:
        target = check_store_path_quietly(store)
        warn_unregistered(target, f"the {kind} result", folder, exc)
    return path


def check_store_path_quietly(store: str | None) -> Path:
    """The store's path for a message, whatever is wrong with it."""
    from dtpo.telemetry.store.paths import store_path

    try:
        return store_path(store)
    except DtpoError:
        return Path(str(store))
