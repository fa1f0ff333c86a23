"""The run store: one SQLite database per project (``runs/dtpo.sqlite``) in which every run is registered.

``dtpo train`` (and ``--tune``), ``dtpo bench``, ``dtpo simulate`` and ``dtpo plan`` each add a row: its id, kind,
status, times, configuration, key figures (with unit and source, so an estimated figure stays marked as one)
and the path of its run directory. The run directory's JSON (``record.json``, ``bench.json``,
``simulate.json``, ``plan.json``) stays the source of truth; :mod:`dtpo.telemetry.store.reindex` rebuilds the
database from it.

Concurrency: the database is in WAL mode, every connection waits up to :data:`TIMEOUT_S` for a lock
(``busy_timeout``), every write is one short ``BEGIN IMMEDIATE`` transaction on a connection of its own, so
runs that register at the same time never lose a row.

Sharing: a store is as private or as shared as its file mode says. dtpo creates it as an ordinary ``open()``
would (``0o666`` less the umask; SQLite alone would give ``0o644``), never changes the mode of one that exists,
and SQLite gives the ``-wal`` and ``-shm`` files beside it the store's mode. A user who may only read the store
(:func:`~dtpo.telemetry.store.paths.write_problem`) reads it through an immutable read-only connection, which
creates no file beside it: a ``-wal`` such a reader left behind would belong to them and stop the owner's
writes. Such a reader sees the store as of its last checkpoint and settles no row.

A row says ``running`` from the start of a run until its end. When the process that registered it is gone
(same host, its pid dead or reused) the row is settled whenever the store is read: from the run directory's
record if the run got to write one, else as ``failed`` with :data:`KILLED_ERROR` - a run killed with SIGKILL
leaves a failed row, not a missing one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dtpo.core.measurement import Measurement
from dtpo.core.record import RECORD_FILE, RunRecord
from dtpo.telemetry.processes import process_alive, process_start
from dtpo.telemetry.store.figures import KINDS, Figure, RunFacts, config_facts, config_kind, figure, record_facts
from dtpo.telemetry.store.paths import (
    CorruptStore,
    StoreError,
    StoreMissing,
    check_store_path,
    dir_key,
    now_iso,
    reindex_hint,
    store_path,
    write_problem,
)
from dtpo.telemetry.store.query import Comparison, FigureDiff, config_differences, filter_sql
from dtpo.telemetry.store.rows import COLUMNS, StoredRun

log = logging.getLogger(__name__)

STORE_VERSION = 1
"""Schema version, kept in ``PRAGMA user_version``."""
TIMEOUT_S = 30.0
"""How long a connection waits for another process's lock before giving up."""
KILLED_ERROR = "the dtpo process ended without finishing the run (killed?)"

_SCHEMA = (
    """CREATE TABLE runs (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
        started_at TEXT, finished_at TEXT, workload TEXT, workers INTEGER, steps INTEGER, parent TEXT,
        error TEXT, run_dir TEXT NOT NULL UNIQUE, hostname TEXT, pid INTEGER, proc_start INTEGER,
        registered_at TEXT NOT NULL, updated_at TEXT NOT NULL, config TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE figures (
        run_id TEXT NOT NULL, name TEXT NOT NULL, value REAL, unit TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT 'measured', note TEXT NOT NULL DEFAULT '', PRIMARY KEY (run_id, name))""",
    "CREATE INDEX runs_by_time ON runs (started_at)",
    "CREATE INDEX runs_by_status ON runs (status)",
)


def as_figures(values: Mapping[str, Figure | Measurement | dict[str, Any] | float | int | None]) -> dict[str, Figure]:
    """Figures from figures, measurements, their dicts or bare numbers (a bare number: measured, no unit)."""
    out: dict[str, Figure] = {}
    for name, value in values.items():
        if isinstance(value, Figure):
            item: Figure | None = value if value.name == name else Figure(name, value.value, value.unit,
                                                                          value.source, value.note)
        elif value is None or isinstance(value, int | float) and not isinstance(value, bool):
            item = Figure(name, None if value is None else float(value))
        else:
            item = figure(name, value)
        if item is not None:
            out[name] = item
    return out


# -- the store ------------------------------------------------------------------------------------------------------

class RunStore:
    """The run store at one path. Every call opens its own short-lived connection.

    Use :meth:`open`; the constructor does not check or create anything.

    Args:
        path: The database file.
        timeout_s: How long to wait for another process's lock.
        read_only: Read it without locks and create nothing beside it (a store this user may read but not
            write); every write fails.
    """

    def __init__(self, path: Path, timeout_s: float = TIMEOUT_S, read_only: bool = False) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.read_only = read_only

    # -- opening --------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, create: bool = True, write: bool = True,
             timeout_s: float = TIMEOUT_S) -> RunStore:
        """Open (and with ``create``, create) the store: WAL mode, the schema, its version checked.

        Args:
            path: The database file; ``None`` for ``runs/dtpo.sqlite`` in the working directory.
            create: Create the file (and its folder) if missing; else raise :class:`StoreMissing`.
            write: Whether the caller writes; without it, a store this user may read but not write is opened
                read-only (see the module docstring).
            timeout_s: How long to wait for another process's lock.

        Raises:
            StoreError: See :func:`check_store_path`; a lock held beyond ``timeout_s``; a newer schema.
            CorruptStore: The file is not a readable dtpo run store.
            StoreMissing: No file and ``create`` is false.
        """
        target = check_store_path(path, write=write)
        if not target.exists():
            if not create:
                raise StoreMissing(f"no run store at {target} yet: dtpo train, bench, simulate and plan register "
                                   f"their runs there, and {reindex_hint(target)} builds it from run directories")
            _create_file(target)
        store = cls(target, timeout_s, read_only=not write and write_problem(target) is not None)
        store._initialise()
        return store

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:  # immutable: no lock, no -wal or -shm made (they would be this user's, see above)
            uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro&immutable=1"
            conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
        return conn

    def failure(self, exc: sqlite3.Error) -> StoreError | None:
        """The one-line error for an SQLite error on this store (``None`` for a fault in dtpo's own SQL)."""
        text = str(exc) or type(exc).__name__
        low = text.lower()
        corrupt = ("malformed", "not a database", "corrupt", "no such table", "no such column")
        if type(exc) is sqlite3.DatabaseError or any(word in low for word in corrupt):
            if self.read_only:  # read without locks: a checkpoint under way looks the same
                return CorruptStore(f"run store {self.path} could not be read ({text}); this user reads it without "
                                    "locks, as they cannot write it: if a run was writing it just then, try again")
            return CorruptStore(f"run store {self.path} is corrupt ({text}); {reindex_hint(self.path)} rebuilds it "
                                "from the run directories")
        if not isinstance(exc, sqlite3.OperationalError):
            return None
        if "locked" in low or "busy" in low:
            return StoreError(f"run store {self.path} stayed locked by another process for over {self.timeout_s:g} s "
                              f"({text}); try again")
        if "readonly" in low or "read-only" in low or "unable to open" in low:
            why = None if self.read_only else write_problem(self.path)
            if why is not None:  # another user's file beside it, say, that appeared since the check
                return StoreError(f"run store {why}")
            if "unable to open" not in low:
                return StoreError(f"run store {self.path} is read-only ({text}); choose another with --store")
        return StoreError(f"run store {self.path} cannot be used ({text})")

    @contextlib.contextmanager
    def _session(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection; with ``write``, inside one ``BEGIN IMMEDIATE`` transaction committed at the end."""
        try:
            conn = self._connect()
        except sqlite3.Error as exc:
            raise self.failure(exc) or exc from None
        try:
            if write:
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if write:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise self.failure(exc) or exc from None
        except BaseException:
            _rollback(conn)
            raise
        finally:
            conn.close()

    def _initialise(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._create_schema()
                return
            except StoreError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _create_schema(self) -> None:
        if self.read_only:
            with self._session() as conn:
                self._check_schema(conn)
            return
        with self._session() as conn:
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.debug("run store %s: journal mode %s (WAL not available here)", self.path, mode)
                conn.execute("BEGIN IMMEDIATE")
                if self._check_schema(conn) == 0:
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {STORE_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise

    def _check_schema(self, conn: sqlite3.Connection) -> int:
        """The store's version (0: an empty database, to be given the schema), after checking it is a dtpo store
        this dtpo reads."""
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version == 0 and tables:
            raise CorruptStore(f"run store {self.path} is a SQLite database but not a dtpo run store "
                               f"(tables {', '.join(sorted(tables))}); choose another file with --store")
        if version == 0 and self.read_only:
            raise StoreError(f"run store {self.path} is empty and this user cannot write it")
        if version > STORE_VERSION:
            raise StoreError(f"run store {self.path} was written by a newer dtpo (store version {version}; "
                             f"this dtpo reads up to {STORE_VERSION})")
        if version and not {"runs", "figures"} <= tables:
            raise CorruptStore(f"run store {self.path} is corrupt (tables missing); {reindex_hint(self.path)} "
                               "rebuilds it from the run directories")
        return version

    # -- writing --------------------------------------------------------------------------------------------------

    def register(self, run_id: str, kind: str, run_dir: str | os.PathLike[str], config: dict[str, Any],
                 status: str = "running", *, parent: str | None = None, started_at: str | None = None,
                 facts: RunFacts | None = None) -> str:
        """Register a run as it starts, as owned by this process (its pid, start time and host).

        A row for the same run directory (a run repeated with ``--overwrite``) is replaced, keeping its id.

        Args:
            run_id: The run's name (its directory's); the store's id is this name, made unique.
            kind: One of :data:`~dtpo.telemetry.store.figures.KINDS`.
            run_dir: The run directory.
            config: The configuration as JSON values.
            status: Its status, ``running`` until :meth:`finish`.
            parent: The id of the bench it is part of.
            started_at: ISO start time (default: now).
            facts: Workload, workers, steps and figures (default: read from ``config``).

        Returns:
            The store's id of the run (pass it to :meth:`finish`).
        """
        facts = facts or config_facts(config)
        row = {"name": run_id, "kind": kind, "status": status, "started_at": started_at or now_iso(),
               "finished_at": None if status == "running" else now_iso(), "workload": facts.workload,
               "workers": facts.workers, "steps": facts.steps, "parent": parent, "error": None,
               "hostname": socket.gethostname(), "pid": os.getpid(), "proc_start": process_start(os.getpid()),
               "config": config}
        with self._session(write=True) as conn:
            return self._upsert(conn, Path(run_dir), row, facts.figures, replace=True)

    def finish(self, run_id: str, status: str,
               figures: Mapping[str, Figure | Measurement | dict[str, Any] | float | None] | None = None,
               error: str | None = None) -> bool:
        """Record how a registered run ended.

        Args:
            run_id: The id :meth:`register` returned.
            status: ``completed``, ``failed``, ``interrupted`` or ``diverged``.
            figures: Its key figures (replacing any stored), as figures, measurements or bare numbers.
            error: Why it did not complete.

        Returns:
            Whether the run was in the store.
        """
        with self._session(write=True) as conn:
            cursor = conn.execute("UPDATE runs SET status = ?, error = ?, finished_at = ?, updated_at = ? WHERE id = ?",
                                  (status, error, now_iso(), now_iso(True), run_id))
            if cursor.rowcount and figures is not None:
                _write_figures(conn, run_id, as_figures(figures))
            return bool(cursor.rowcount)

    def register_record(self, record: RunRecord, run_dir: str | os.PathLike[str], kind: str | None = None,
                        parent: str | None = None) -> str:
        """Add or update a train or tune run from its record (at its end, or when reindexing).

        Returns:
            The store's id of the run.
        """
        facts = record_facts(record)
        row = {"name": record.run_id, "kind": kind or config_kind(record.config), "status": record.status,
               "started_at": record.started_at, "finished_at": record.finished_at, "workload": facts.workload,
               "workers": facts.workers, "steps": facts.steps, "parent": parent, "error": record.error,
               "config": record.config}
        with self._session(write=True) as conn:
            return self._upsert(conn, Path(run_dir), row, facts.figures)

    def register_result(self, kind: str, run_dir: str | os.PathLike[str], facts: RunFacts, *,
                        status: str = "completed", started_at: str | None = None, finished_at: str | None = None,
                        parent: str | None = None, error: str | None = None) -> str:
        """Add or update a bench, simulate or plan result (see :func:`~dtpo.telemetry.store.figures.result_facts`).

        Returns:
            The store's id of the result.
        """
        row = {"name": Path(run_dir).name, "kind": kind, "status": status, "started_at": started_at,
               "finished_at": finished_at or (None if status == "running" else now_iso()),
               "workload": facts.workload, "workers": facts.workers, "steps": facts.steps, "parent": parent,
               "error": error, "config": facts.config}
        with self._session(write=True) as conn:
            return self._upsert(conn, Path(run_dir), row, facts.figures)

    def _upsert(self, conn: sqlite3.Connection, run_dir: Path, row: dict[str, Any], figures: dict[str, Figure],
                replace: bool = False, preferred_id: str | None = None) -> str:
        """Write one run: the row of the same run directory updated (``replace``: overwritten), else a new one."""
        if row["kind"] not in KINDS:
            raise ValueError(f"unknown run kind {row['kind']!r} (choose from: {', '.join(KINDS)})")
        where = dir_key(run_dir)
        old = conn.execute("SELECT * FROM runs WHERE run_dir = ?", (where,)).fetchone()
        now = now_iso(True)
        values = dict(row, run_dir=where, updated_at=row.get("updated_at") or now)
        if old is not None:
            run_id = old["id"]
            if not replace:  # keep what this write does not know: the owner, the start, the parent
                for key in ("started_at", "parent", "hostname", "pid", "proc_start", "workload", "workers", "steps"):
                    if values.get(key) is None:
                        values[key] = old[key]
            values["registered_at"] = old["registered_at"]
        else:
            run_id = self._free_id(conn, preferred_id or row["name"], run_dir)
            values["registered_at"] = row.get("registered_at") or now
        values["id"] = run_id
        values["config"] = json.dumps(values.get("config") or {}, default=str)
        names = [*COLUMNS, "config"]
        conn.execute(f"INSERT OR REPLACE INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                     [values.get(n) for n in names])
        _write_figures(conn, run_id, figures)
        return run_id

    @staticmethod
    def _free_id(conn: sqlite3.Connection, name: str, run_dir: Path) -> str:
        """``name`` if no other run has it, else ``PARENT/name``, else ``name~2``, ``name~3``, ..."""
        def taken(candidate: str) -> bool:
            return conn.execute("SELECT 1 FROM runs WHERE id = ?", (candidate,)).fetchone() is not None

        for candidate in (name, f"{Path(dir_key(run_dir)).parent.name}/{name}"):
            if candidate and not taken(candidate):
                return candidate
        n = 2
        while taken(f"{name}~{n}"):
            n += 1
        return f"{name}~{n}"

    def replace_all(self, runs: Sequence[StoredRun], since: str | None = None) -> int:
        """Replace the whole content with ``runs`` in one transaction (what ``dtpo runs reindex`` does).

        A row written after ``since`` (an ISO time, by a run registering while the rebuild read the run
        directories) wins over the rebuilt one of the same run directory and is kept if there is none.

        Returns:
            How many such newer rows were kept.
        """
        with self._session(write=True) as conn:
            newer = []
            if since is not None:
                rows = conn.execute("SELECT * FROM runs WHERE updated_at > ?", (since,)).fetchall()
                figures = self._figures(conn, [r["id"] for r in rows])
                newer = [StoredRun.from_row(r, figures[r["id"]]) for r in rows]
            kept = {run.run_dir for run in newer}
            conn.execute("DELETE FROM figures")
            conn.execute("DELETE FROM runs")
            for run in [*newer, *(r for r in runs if dir_key(r.run_dir) not in kept)]:
                row = {name: getattr(run, name) for name in COLUMNS if name not in ("id", "run_dir")}
                row["config"] = run.config
                self._upsert(conn, Path(run.run_dir), row, run.figures, replace=True, preferred_id=run.id)
        return len(newer)

    # -- reading --------------------------------------------------------------------------------------------------

    def settle(self) -> list[str]:
        """Settle the ``running`` rows of this host whose registering process is gone: from the run directory's
        record when it has a final one, else as ``failed`` (:data:`KILLED_ERROR`).

        Returns:
            The ids of the rows settled (none on a read-only store: its rows stay as their writers left them).
        """
        if self.read_only:
            return []
        host = socket.gethostname()
        with self._session() as conn:
            rows = conn.execute("SELECT * FROM runs WHERE status = 'running' AND hostname = ?", (host,)).fetchall()
        settled = []
        for row in rows:
            if row["pid"] is None or process_alive(row["pid"], row["proc_start"]):
                continue
            self._settle(StoredRun.from_row(row))
            settled.append(row["id"])
        return settled

    def _settle(self, run: StoredRun) -> None:
        run_dir = Path(run.run_dir)
        if run.kind in ("train", "tune"):
            record = _final_record(run_dir)
            if record is not None:
                log.info("run store: %s ended without registering its end; taken from %s", run.id, run_dir)
                self.register_record(record, run_dir, kind=run.kind, parent=run.parent)
                return
        figures = partial_figures(run_dir) if run.kind in ("train", "tune") else {}
        with self._session(write=True) as conn:
            cursor = conn.execute("UPDATE runs SET status = 'failed', error = ?, finished_at = ?, updated_at = ? "
                                  "WHERE id = ? AND status = 'running' AND pid IS ?",
                                  (KILLED_ERROR, now_iso(), now_iso(True), run.id, run.pid))
            if cursor.rowcount and figures:
                _write_figures(conn, run.id, figures)

    def _figures(self, conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, dict[str, Figure]]:
        out: dict[str, dict[str, Figure]] = {i: {} for i in ids}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            query = (f"SELECT * FROM figures WHERE run_id IN ({', '.join('?' * len(chunk))}) "
                     "ORDER BY run_id, rowid")
            for r in conn.execute(query, chunk):
                out[r["run_id"]][r["name"]] = Figure(r["name"], r["value"], r["unit"], r["source"], r["note"])
        return out

    def list_runs(self, filters: Sequence[str] = (), limit: int | None = None) -> list[StoredRun]:
        """The runs that match every filter (``KEY=VALUE``, see :func:`parse_filter`), newest first.

        Raises:
            StoreError: A bad filter.
        """
        where, params = filter_sql(filters)
        self.settle()
        query = f"SELECT * FROM runs{where} ORDER BY COALESCE(started_at, registered_at) DESC, registered_at DESC"
        if limit is not None:
            query += " LIMIT ?"
            params.append(int(limit))
        with self._session() as conn:
            rows = conn.execute(query, params).fetchall()
            figures = self._figures(conn, [r["id"] for r in rows])
        return [StoredRun.from_row(r, figures[r["id"]]) for r in rows]

    def get(self, key: str) -> StoredRun:
        """One run by its id, its run directory, a unique prefix of its id, or its unique name.

        Raises:
            StoreError: No such run (naming ``dtpo runs list``), or the prefix fits several.
        """
        self.settle()
        with self._session() as conn:
            rows = conn.execute("SELECT * FROM runs WHERE id = ?", (key,)).fetchall()
            if not rows:
                rows = conn.execute("SELECT * FROM runs WHERE run_dir = ?", (dir_key(key),)).fetchall()
            if not rows:
                pattern = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                rows = conn.execute("SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY id LIMIT 6",
                                    (pattern,)).fetchall()
            if len(rows) > 1:
                named = conn.execute("SELECT * FROM runs WHERE name = ?", (key,)).fetchall()
                if len(named) == 1:
                    rows = named
            if len(rows) == 1:
                return StoredRun.from_row(rows[0], self._figures(conn, [rows[0]["id"]])[rows[0]["id"]])
        if not rows:
            where = "" if self.path == store_path(None) else f" --store {self.path}"
            raise StoreError(f"no run {key!r} in the run store {self.path}; `dtpo runs list{where}` shows the runs")
        ids = [r["id"] for r in rows]
        raise StoreError(f"run id {key!r} is ambiguous: it starts {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}"
                         "; give more of it")

    def compare(self, a: str, b: str) -> Comparison:
        """Two runs side by side: their figures and the configuration keys that differ."""
        first, second = self.get(a), self.get(b)
        names = list(dict.fromkeys([*first.figures, *second.figures]))
        diffs = [FigureDiff(n, first.figures.get(n), second.figures.get(n)) for n in names]
        return Comparison(first, second, diffs, config_differences(first.config, second.config))

    def export_rows(self, filters: Sequence[str] = ()) -> tuple[list[str], list[list[Any]]]:
        """A header and one row per run (newest first) for CSV: the columns, one column per figure name
        (``NAME [UNIT]``), ``estimated`` (the names of the run's estimated figures) and the config as JSON."""
        runs = self.list_runs(filters)
        units: dict[str, str] = {}
        for run in runs:
            for name, item in run.figures.items():
                units.setdefault(name, item.unit)
        names = sorted(units)
        columns = [c for c in COLUMNS if c != "proc_start"]
        header = [*columns, *(f"{n} [{units[n]}]" if units[n] else n for n in names), "estimated", "config"]
        rows = []
        for run in runs:
            values = [getattr(run, c) for c in columns]
            values += [run.figures[n].value if n in run.figures else None for n in names]
            values.append(";".join(n for n, f in run.figures.items() if f.estimated))
            values.append(json.dumps(run.config, sort_keys=True, default=str))
            rows.append(values)
        return header, rows

    def all_rows(self) -> list[StoredRun]:
        """Every run as stored, without settling anything (for :mod:`dtpo.telemetry.store.reindex`)."""
        with self._session() as conn:
            rows = conn.execute("SELECT * FROM runs ORDER BY registered_at").fetchall()
            figures = self._figures(conn, [r["id"] for r in rows])
        return [StoredRun.from_row(r, figures[r["id"]]) for r in rows]

    def journal_mode(self) -> str:
        """The database's journal mode (``wal`` when WAL is on)."""
        with self._session() as conn:
            return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()


def _create_file(target: Path) -> None:
    """Create an empty store file (and its folder) as an ordinary ``open()`` would: ``0o666`` less the umask, where
    SQLite alone would give ``0o644`` and keep a store in a group's folder from the group."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"run store {target}: cannot create folder {target.parent} ({exc.strerror or exc})") from None
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
    except FileExistsError:
        pass  # another run created it meanwhile
    except OSError as exc:
        raise StoreError(f"run store {target}: cannot create it ({exc.strerror or exc})") from None


def _rollback(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _write_figures(conn: sqlite3.Connection, run_id: str, figures: dict[str, Figure]) -> None:
    conn.execute("DELETE FROM figures WHERE run_id = ?", (run_id,))
    conn.executemany("INSERT INTO figures (run_id, name, value, unit, source, note) VALUES (?, ?, ?, ?, ?, ?)",
                     [(run_id, f.name, f.value, f.unit, f.source, f.note) for f in figures.values()])


def _final_record(run_dir: Path) -> RunRecord | None:
    """The run directory's record if it holds one with a final status."""
    if not (run_dir / RECORD_FILE).is_file():
        return None
    try:
        record = RunRecord.load(run_dir)
    except Exception:  # noqa: BLE001 - an unreadable record is no final record
        return None
    return record if record.status != "running" else None


def partial_figures(run_dir: Path) -> dict[str, Figure]:
    """What the ranks of a killed run measured, from their partial records (none when there are none)."""
    from dtpo.core.record import load_partial_records
    from dtpo.core.totals import record_from_partials

    try:
        partials = load_partial_records(run_dir)
        record = record_from_partials(run_dir, "failed", KILLED_ERROR, partials) if partials else None
    except Exception:  # noqa: BLE001 - figures of a killed run are a bonus, never a reason to fail a read
        return {}
    return record_facts(record).figures if record is not None else {}
