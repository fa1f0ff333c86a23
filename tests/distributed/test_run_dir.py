"""Run directories: checked and created before any process starts; a record is never overwritten silently."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core.errors import ConfigError
from dtpo.distributed.run_dir import LAUNCHER_LOG, is_empty_run, prepare_run_dir, remove_empty_run


def test_no_path_makes_a_new_run_under_the_default_root(tmp_path: Path) -> None:
    first = prepare_run_dir(None, default_root=tmp_path / "runs")
    second = prepare_run_dir(None, default_root=tmp_path / "runs")
    assert first.is_dir() and second.is_dir() and first != second and first.parent == (tmp_path / "runs").resolve()


def test_a_named_directory_is_created_with_its_parents(tmp_path: Path) -> None:
    path = prepare_run_dir(str(tmp_path / "a" / "b"))
    assert path == (tmp_path / "a" / "b").resolve() and path.is_dir()


def test_an_empty_string_is_refused_instead_of_writing_into_the_current_directory() -> None:
    with pytest.raises(ConfigError, match="--run-dir must name a directory, got an empty string"):
        prepare_run_dir("")


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("keep")
    with pytest.raises(ConfigError, match=r"--run-dir .*f is a file, not a directory"):
        prepare_run_dir(tmp_path / "f")
    assert (tmp_path / "f").read_text() == "keep"


def test_a_path_under_a_file_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("keep")
    with pytest.raises(ConfigError, match=r"--run-dir .* lies under the file .*f, not a directory"):
        prepare_run_dir(tmp_path / "f" / "run" / "deeper")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(ConfigError, match="--run-dir .* is not writable"):
        prepare_run_dir(tmp_path / "ro")
    with pytest.raises(ConfigError, match="--run-dir .*cannot create it"):
        prepare_run_dir(tmp_path / "ro" / "run")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_an_unwritable_directory_is_refused_even_for_root() -> None:
    with pytest.raises(ConfigError, match="--run-dir /proc/self is not writable"):
        prepare_run_dir("/proc/self")
    with pytest.raises(ConfigError, match="--run-dir /proc/forbidden/run: cannot create it"):
        prepare_run_dir("/proc/forbidden/run")


def test_a_directory_holding_a_record_is_refused_unless_overwrite(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "record.json").write_text("{}")
    (run / "ranks" / "rank00000.json").write_text("{}")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="--run-dir .* already holds a run record .*--overwrite"):
        prepare_run_dir(run)
    assert (run / "record.json").read_text() == "{}"  # never lose a record
    assert prepare_run_dir(run, overwrite=True) == run.resolve()
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # the old record went, nothing else


def test_partial_rank_records_count_as_a_record(tmp_path: Path) -> None:
    (tmp_path / "run" / "ranks").mkdir(parents=True)
    (tmp_path / "run" / "ranks" / "rank00001.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run record"):
        prepare_run_dir(tmp_path / "run")


def test_an_existing_empty_directory_is_used(tmp_path: Path) -> None:
    assert prepare_run_dir(tmp_path) == tmp_path.resolve()


def test_empty_runs_are_recognised_and_removed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / LAUNCHER_LOG).write_text("agent log")
    assert is_empty_run(run) and remove_empty_run(run) and not run.exists()
    (run / "ranks").mkdir(parents=True)
    (run / "ranks" / "rank00000.json").write_text("{}")
    assert not is_empty_run(run) and not remove_empty_run(run) and run.exists()


@pytest.mark.slow
@pytest.mark.parametrize("make, message", [
    (lambda tmp: (tmp / "f").write_text("x") and str(tmp / "f"), "is a file"),
    (lambda tmp: (tmp / "f").write_text("x") and str(tmp / "f" / "run"), "lies under the file"),
    (lambda tmp: "", "--run-dir must name a directory"),
])
def test_dtpo_launch_refuses_a_bad_run_dir_in_one_line_before_any_process_starts(tmp_path: Path, make,
                                                                                 message: str) -> None:
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('a worker started')\n")
    run_dir = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--run-dir", run_dir, str(script)),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
