"""A run store shared through the file system: readable and writable only as its file mode says.

The other users are real: a forked child drops root for another uid (and its groups) and uses the store as that
user, so the kernel, not dtpo, decides what it may do. ``OWNER`` owns the store; ``OTHER`` is someone else.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dtpo.core.record import RunRecord
from dtpo.telemetry.store.database import RunStore, StoreError
from dtpo.telemetry.store.figures import RunFacts, modelled
from dtpo.telemetry.store.reindex import reindex

OWNER, OTHER, GROUP = 65534, 54321, 4242
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can act as other users")


def as_user(uid: int, fn: Callable[[], Any], groups: tuple[int, ...] = (), umask: int = 0o022) -> Any:
    """``fn()`` run by ``uid`` (with ``groups``) in a forked child: its JSON-able result, or ``"Error: message"``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        result: Any = None
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(uid)
            os.setuid(uid)
            os.umask(umask)
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as text
            result = f"{type(exc).__name__}: {exc}"
        finally:
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(result, default=str))
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    assert text, "the child died without an answer"
    return json.loads(text)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may create files in, like ``/tmp`` (pytest's own folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="dtpo-shared-"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def names(store: Path) -> list[str]:
    """The store's files: the database and whatever SQLite left beside it."""
    return sorted(p.name for p in store.parent.iterdir() if p.name.startswith(store.name))


def register(store: Path, name: str) -> Callable[[], str]:
    def write() -> str:
        facts = RunFacts(figures={"joules_per_sample": modelled("joules_per_sample", 1.5, "J/sample")})
        return RunStore.open(store).register_result("simulate", store.parent / name, facts)
    return write


def listed(store: Path) -> Callable[[], list[str]]:
    return lambda: sorted(run.id for run in RunStore.open(store, create=False, write=False).list_runs())


def test_a_new_store_and_the_files_beside_it_take_the_umask(tmp_path: Path) -> None:
    for umask, mode in ((0o002, 0o664), (0o077, 0o600)):
        path = tmp_path / f"umask-{umask:03o}" / "dtpo.sqlite"
        before = os.umask(umask)
        try:
            RunStore.open(path)
        finally:
            os.umask(before)
        assert stat.S_IMODE(path.stat().st_mode) == mode  # SQLite alone gives 0644 whatever the umask
        with contextlib.closing(sqlite3.connect(path)) as conn:  # -wal and -shm exist while it is open
            conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            assert {stat.S_IMODE(Path(f"{path}{s}").stat().st_mode) for s in ("-wal", "-shm")} == {mode}


@as_root
@pytest.mark.parametrize("folder_mode", [0o1777, 0o755], ids=["sticky-shared-folder", "owners-own-folder"])
def test_a_store_another_user_may_only_read_is_read_without_a_trace_and_refused_for_writing(
        shared: Path, folder_mode: int) -> None:
    folder = shared / "project"
    folder.mkdir()
    os.chown(folder, OWNER, OWNER)
    folder.chmod(folder_mode)
    store = folder / "team.sqlite"
    assert as_user(OWNER, register(store, "mine")) == "mine"
    assert stat.S_IMODE(store.stat().st_mode) == 0o644 and names(store) == ["team.sqlite"]
    assert as_user(OTHER, listed(store)) == ["mine"]  # what the mode allows: reading
    assert names(store) == ["team.sqlite"]  # no -wal or -shm of OTHER's, which would stop OWNER's writes
    refused = as_user(OTHER, register(store, "theirs"))
    assert refused == (f"StoreError: run store {store} belongs to nobody (uid 65534) with mode 0644: this user can "
                       f"read it but not write it; ask its owner to share it with your group (chgrp GROUP {store} && "
                       f"chmod 660 {store}, and chmod g+s on its folder), or use a store of your own with --store")
    assert as_user(OWNER, register(store, "mine-again")) == "mine-again"  # the reader left nothing in the way
    assert as_user(OTHER, listed(store)) == ["mine", "mine-again"]


@as_root
def test_a_store_another_user_may_not_read_is_one_line(shared: Path) -> None:
    store = shared / "private.sqlite"
    assert as_user(OWNER, register(store, "mine"), umask=0o077) == "mine"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    refused = as_user(OTHER, listed(store))
    assert refused.startswith(f"StoreError: run store {store} belongs to nobody (uid 65534) with mode 0600: this user "
                              "cannot read it; ask its owner to share it") and "\n" not in refused
    assert as_user(OWNER, listed(store)) == ["mine"]


@as_root
def test_a_group_shared_store_works_for_its_members_only(shared: Path) -> None:
    folder = shared / "group"
    folder.mkdir()
    os.chown(folder, 0, GROUP)
    folder.chmod(0o2775)  # setgid: what SQLite makes beside the store gets the store's group
    store = folder / "team.sqlite"
    assert as_user(OWNER, register(store, "mine"), groups=(GROUP,), umask=0o002) == "mine"
    assert stat.S_IMODE(store.stat().st_mode) == 0o664 and store.stat().st_gid == GROUP
    assert as_user(OTHER, register(store, "theirs"), groups=(GROUP,)) == "theirs"
    assert as_user(OWNER, listed(store), groups=(GROUP,)) == ["mine", "theirs"]
    store.chmod(0o660)  # the owner closes it to everyone outside the group
    outside = as_user(OTHER, listed(store))
    assert outside.startswith("StoreError: ") and "with mode 0660: this user cannot read it" in outside
    assert as_user(OTHER, register(store, "theirs-again"), groups=(GROUP,)) == "theirs-again"
    assert as_user(OTHER, warnings_of(register(store, "theirs-3")), groups=(GROUP,)) == []  # setgid: all is well


@as_root
def test_a_group_shared_store_in_a_folder_without_setgid_is_warned_about(shared: Path) -> None:
    store = shared / "team.sqlite"
    assert as_user(OWNER, register(store, "mine"), groups=(GROUP,), umask=0o002) == "mine"
    os.chown(store, OWNER, GROUP)
    [warning] = as_user(OTHER, warnings_of(register(store, "theirs")), groups=(GROUP,))
    assert warning == (f"run store {store} is shared through its group {GROUP}, but its folder lacks the setgid bit: "
                       "the files SQLite keeps beside it while this user writes get this user's group, and others "
                       f"cannot open the store meanwhile; fix: chgrp {GROUP} {shared} && chmod g+s {shared}")


def warnings_of(fn: Callable[[], Any]) -> Callable[[], list[str]]:
    """``fn`` run with the store's warnings collected: their messages."""
    def run() -> list[str]:
        messages: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("dtpo.telemetry.store")
        logger.addHandler(handler)
        try:
            fn()
        finally:
            logger.removeHandler(handler)
        return messages
    return run


@as_root
def test_a_file_another_user_left_beside_the_store_is_named(shared: Path) -> None:
    store = shared / "team.sqlite"
    assert as_user(OWNER, register(store, "mine")) == "mine"
    wal = Path(f"{store}-wal")
    wal.touch(mode=0o644)
    os.chown(wal, OTHER, OTHER)  # what a plain read-only SQLite connection of OTHER's leaves behind
    refused = as_user(OWNER, register(store, "blocked"))
    assert refused.startswith(f"StoreError: run store {store}: {wal} belongs to uid 54321 with mode 0644, so this "
                              "user cannot write the store while that file is there")


def test_a_read_only_store_of_ones_own_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "dtpo.sqlite"
    register(store, "mine")()
    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.W_OK)  # root could write it anyway
    with pytest.raises(StoreError, match=f"run store {store} has mode 0644: this user can read it but not write "
                                         f"it; chmod u\\+rw {store}, or use another store"):
        RunStore.open(store)
    reader = RunStore.open(store, create=False, write=False)
    assert reader.read_only and [run.id for run in reader.list_runs()] == ["mine"]


@as_root
def test_reindex_keeps_the_owner_mode_and_group_of_the_store_it_replaces(tmp_path: Path) -> None:
    store = tmp_path / "team.sqlite"
    store.write_bytes(b"garbage" * 100)  # corrupt: rebuilt in a fresh file put in its place
    store.chmod(0o660)
    os.chown(store, OWNER, GROUP)
    RunRecord("a", "completed", "2026-01-01T00:00:00+00:00").save(tmp_path / "runs" / "a")
    report = reindex(store, [tmp_path / "runs"])  # by root, say, for a team
    assert report.corrupt_copy is not None and report.total == 1
    rebuilt = store.stat()
    assert (stat.S_IMODE(rebuilt.st_mode), rebuilt.st_uid, rebuilt.st_gid) == (0o660, OWNER, GROUP)


@as_root
def test_the_cli_reads_another_users_store_and_refuses_to_write_it_in_one_line(shared: Path) -> None:
    from dtpo.cli.app import main

    store = shared / "team.sqlite"
    assert as_user(OWNER, register(store, "mine")) == "mine"

    def cli(*argv: str) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as end:
                main([*argv, "--store", str(store)])
            return [end.value.code, out.getvalue(), err.getvalue()]
        return run

    code, out, err = as_user(OTHER, cli("runs", "list"))
    assert code == 0 and "mine" in out and "1.5 J/sample" in out, err
    code, out, err = as_user(OTHER, cli("simulate", "--steps", "5", "--run-dir", str(shared / "sim")))
    assert code == 2 and "Traceback" not in out + err
    assert err.strip() == (f"dtpo: error: run store {store} belongs to nobody (uid 65534) with mode 0644: this user "
                           f"can read it but not write it; ask its owner to share it with your group (chgrp GROUP "
                           f"{store} && chmod 660 {store}, and chmod g+s on its folder), or use a store of your own "
                           "with --store")
    assert not (shared / "sim").exists()  # refused before it simulated anything
