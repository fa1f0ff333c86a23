"""``dtpo runs reindex``: rebuild the run store from the run directories, whose JSON is the source of truth.

Every directory under the given roots (default ``runs/``) is read: one holding ``record.json`` is a train run
(``tune`` when its config tunes a knob), ``bench.json`` a bench (its ``workers-N`` runs are its children),
``simulate.json`` a simulation, ``plan.json`` a plan; a ``config.json`` of dtpo's alone is a training run that
never wrote its record (killed): it is kept as ``failed``, with what its ranks' partial records measured,
unless the store knows it as still running. The directories of rows already in the store are read as well
(runs anywhere else on disk keep their row); rows whose directory is gone are dropped.

A healthy store is rewritten in one transaction, so readers see the old content or the new one and a run that
registers meanwhile keeps its row. A corrupt store is set aside as ``PATH.corrupt-<time>`` and a fresh file
replaces it atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtpo.core.errors import DtpoError
from dtpo.core.record import RECORD_FILE, RunRecord
from dtpo.telemetry.store.database import RunStore, partial_figures
from dtpo.telemetry.store.figures import config_facts, config_kind, record_facts, result_facts
from dtpo.telemetry.store.paths import (
    DEFAULT_STORE,
    CorruptStore,
    StoreError,
    check_store_path,
    dir_key,
    now_iso,
    store_path,
)
from dtpo.telemetry.store.rows import StoredRun

log = logging.getLogger(__name__)

RESULT_FILES = {"bench.json": "bench", "simulate.json": "simulate", "plan.json": "plan"}
"""The JSON file that makes a directory a result of each kind (besides ``record.json``)."""
CONFIG_FILE = "config.json"
NO_RECORD_ERROR = "the run left no record.json (killed before it finished)"
_NOT_RUNS = {"ranks", "trace"}  # folders inside a run directory that are no runs of their own


@dataclass
class ReindexReport:
    """What a reindex did.

    Attributes:
        path: The store.
        counts: Runs written, by kind.
        skipped: Directories with a run file that could not be read, with why.
        dropped: Rows whose run directory is gone.
        kept: Rows written by runs registering during the rebuild, kept as they were.
        corrupt_copy: Where the corrupt store was set aside, if it was.
    """

    path: Path
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    dropped: int = 0
    kept: int = 0
    corrupt_copy: Path | None = None

    @property
    def total(self) -> int:
        """Runs in the rebuilt store."""
        return sum(self.counts.values()) + self.kept


def _mtime_iso(path: Path) -> str:
    return _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.UTC).isoformat(timespec="seconds")


def read_run_dir(path: Path) -> StoredRun | None:
    """The row a run directory's JSON gives (``None``: the directory holds no run). The id is its name.

    Raises:
        DtpoError: It holds a run file that cannot be read.
    """
    path = Path(dir_key(path))
    if (path / RECORD_FILE).is_file():
        record = RunRecord.load(path)
        facts = record_facts(record)
        return StoredRun(id=path.name, name=record.run_id, kind=config_kind(record.config), status=record.status,
                         run_dir=str(path), config=record.config, figures=facts.figures,
                         started_at=record.started_at, finished_at=record.finished_at, workload=facts.workload,
                         workers=facts.workers, steps=facts.steps, error=record.error)
    for filename, kind in RESULT_FILES.items():
        if (path / filename).is_file():
            data = _read_json(path / filename)
            facts = result_facts(kind, data)
            when = _mtime_iso(path / filename)
            return StoredRun(id=path.name, name=path.name, kind=kind, status="completed", run_dir=str(path),
                             config=facts.config, figures=facts.figures, started_at=when, finished_at=when,
                             workload=facts.workload, workers=facts.workers, steps=facts.steps)
    if (path / CONFIG_FILE).is_file():
        config = _read_json(path / CONFIG_FILE)
        if not str(config.get("schema", "")).startswith("dtpo.config"):
            return None
        facts = config_facts(config)
        return StoredRun(id=path.name, name=path.name, kind=config_kind(config), status="failed", run_dir=str(path),
                         config=config, figures=partial_figures(path), started_at=_mtime_iso(path / CONFIG_FILE),
                         workload=facts.workload, workers=facts.workers, steps=facts.steps, error=NO_RECORD_ERROR)
    return None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise DtpoError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise DtpoError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise DtpoError(f"{path} is not a JSON object")
    return data


def find_runs(roots: Sequence[Path]) -> tuple[list[StoredRun], list[tuple[Path, str]]]:
    """Every run directory under ``roots`` (parents before children), and the ones that could not be read."""
    found: list[StoredRun] = []
    skipped: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for root in roots:
        for folder, dirs, _ in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _NOT_RUNS and not d.startswith("."))
            here = Path(dir_key(folder))
            if str(here) in seen:
                dirs[:] = []
                continue
            try:
                run = read_run_dir(here)
            except DtpoError as exc:
                skipped.append((here, str(exc)))
                continue
            if run is None:
                continue
            seen.add(str(here))
            found.append(run)
            if run.kind not in ("bench",):
                dirs[:] = []  # a run's own folders hold no runs (a bench's workers-N do)
    return found, skipped


def _assign_ids(runs: list[StoredRun], old: dict[str, StoredRun]) -> None:
    """Keep each run's old id; give the others their name, made unique; link bench children to their bench."""
    dirs = {run.run_dir for run in runs}
    taken = {run.id for d, run in old.items() if d in dirs}
    by_dir = {}
    for run in runs:
        previous = old.get(run.run_dir)
        if previous is not None:
            run.id = previous.id
        else:
            candidates = [run.id, f"{Path(run.run_dir).parent.name}/{run.id}"]
            run.id = next((c for c in candidates if c not in taken), None) or _numbered(run.id, taken)
        taken.add(run.id)
        by_dir[run.run_dir] = run
    for run in runs:
        bench = by_dir.get(str(Path(run.run_dir).parent))
        if bench is not None and bench.kind == "bench" and run.kind in ("train", "tune"):
            run.parent = bench.id
        elif run.parent is None and run.run_dir in old:
            run.parent = old[run.run_dir].parent


def _numbered(name: str, taken: set[str]) -> str:
    n = 2
    while f"{name}~{n}" in taken:
        n += 1
    return f"{name}~{n}"


def _merge(found: StoredRun, previous: StoredRun | None) -> StoredRun:
    """The row to write for a run directory: what its JSON says, except for a run that never wrote its record
    and that the store knows better (still running, or already settled)."""
    if previous is None or found.error != NO_RECORD_ERROR:
        if previous is not None:
            found.registered_at = previous.registered_at
            found.hostname, found.pid, found.proc_start = previous.hostname, previous.pid, previous.proc_start
        return found
    return previous


def reindex(path: str | os.PathLike[str] | None,
            roots: Sequence[str | os.PathLike[str]] | None = None) -> ReindexReport:
    """Rebuild the store at ``path`` from the run directories under ``roots`` (default ``runs/``) and those of
    the rows it already holds.

    Raises:
        StoreError: The store path is unusable (a directory, an unwritable folder), or a root given is not
            a directory.
    """
    target = store_path(path)
    corrupt = False
    try:
        check_store_path(target)
    except CorruptStore:
        corrupt = True
    default = roots is None or len(roots) == 0
    folders = [DEFAULT_STORE.parent.absolute()] if default else [Path(r).expanduser().absolute() for r in roots]
    for folder in folders:
        if not folder.is_dir() and not (default and not folder.exists()):
            raise StoreError(f"reindex: {folder} is not a directory of runs")
    report = ReindexReport(target)
    since = now_iso(True)
    old: dict[str, StoredRun] = {}
    if target.exists() and not corrupt:
        try:
            old = {run.run_dir: run for run in RunStore.open(target, create=False).all_rows()}
        except CorruptStore:
            corrupt = True
    found, report.skipped = find_runs([f for f in folders if f.is_dir()])
    seen = {run.run_dir for run in found}
    for run_dir, previous in old.items():
        if run_dir in seen:
            continue
        try:
            again = read_run_dir(Path(run_dir)) if Path(run_dir).is_dir() else None
        except DtpoError as exc:
            report.skipped.append((Path(run_dir), str(exc)))
            again = None
        if again is not None:
            found.append(again)
        elif Path(run_dir).is_dir():
            found.append(previous)  # its directory holds no run file (yet): the row is all there is
        else:
            report.dropped += 1
    rows = [_merge(run, old.get(run.run_dir)) for run in found]
    _assign_ids(rows, old)
    report.counts = dict(Counter(run.kind for run in rows))
    if corrupt:
        report.corrupt_copy = _rebuild_beside(target, rows)
    else:
        store = RunStore.open(target)
        report.kept = store.replace_all(rows, since=since)
    return report


def _rebuild_beside(target: Path, rows: list[StoredRun]) -> Path | None:
    """Write ``rows`` into a fresh file, set the corrupt one (and its WAL files) aside, put the fresh one in its
    place. Returns where the corrupt one went."""
    tmp = target.with_name(f".{target.name}.reindex-{os.getpid()}")
    _remove_database(tmp)
    try:
        RunStore.open(tmp).replace_all(rows)
        _remove_database(tmp, keep_main=True)  # every connection is closed: the WAL was checkpointed
        _keep_mode_and_group(tmp, target)
        stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
        aside = target.with_name(f"{target.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{target}{suffix}")
            if source.exists():
                os.replace(source, Path(f"{aside}{suffix}"))
        os.replace(tmp, target)
    except OSError as exc:
        _remove_database(tmp)
        raise StoreError(f"reindex: cannot replace the run store {target} ({exc.strerror or exc})") from None
    except BaseException:
        _remove_database(tmp)
        raise
    log.warning("the corrupt run store was kept as %s", aside)
    return aside


def _keep_mode_and_group(fresh: Path, old: Path) -> None:
    """Give the rebuilt store the mode of the one it replaces and, where this user may, its group (a member of it
    may) and owner (root may), so a store shared with a group stays shared and a private one stays private."""
    st = old.stat()
    for uid in (st.st_uid, -1):
        try:
            os.chown(fresh, uid, st.st_gid)
            break
        except OSError:
            continue
    os.chmod(fresh, stat.S_IMODE(st.st_mode))


def _remove_database(path: Path, keep_main: bool = False) -> None:
    for suffix in ("-wal", "-shm") if keep_main else ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
