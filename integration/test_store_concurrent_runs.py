"""Two ``dtpo train`` runs at once both register; a run killed with SIGKILL leaves its row failed, not missing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

from conftest import dtpo_cli, wait_until

TRAIN = ("train", "--workload", "mlp", "--workers", "2", "--warmup-steps", "1")


def _status(store: Path, run_id: str) -> str | None:
    with sqlite3.connect(store, timeout=30) as db:
        row = db.execute("SELECT status FROM runs WHERE name = ?", (run_id,)).fetchone()
    return row[0] if row else None


def _workers_of(run_dir: Path) -> list[int]:
    """Processes whose environment names ``run_dir`` (the workers of that run)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_concurrent_runs_both_register_and_a_killed_run_reads_as_failed(tmp_path: Path) -> None:
    store = tmp_path / "dtpo.sqlite"
    runs = [tmp_path / "one", tmp_path / "two"]
    procs = [subprocess.Popen(dtpo_cli(*TRAIN, "--steps", "30", "--run-dir", str(d), "--store", str(store)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in runs]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
    assert [_status(store, d.name) for d in runs] == ["completed", "completed"]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(dtpo_cli(*TRAIN, "--steps", "100000", "--run-dir", str(killed), "--store", str(store)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: (killed / "ranks" / "rank00001.json").exists(), 180, "the run to start measuring")
        assert _status(store, killed.name) == "running"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies without a word (its workers run in own sessions)
        proc.wait()
    # The workers learn of their launcher's death (SIGTERM from the kernel) and stop, leaving interrupted partials.
    wait_until(lambda: not _workers_of(killed), 120, "the workers of the killed launcher to stop")
    listed = subprocess.run(dtpo_cli("runs", "list", "--store", str(store)), capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert killed.name in listed.stdout
    assert _status(store, killed.name) == "failed"
    shown = subprocess.run(dtpo_cli("runs", "show", killed.name, "--store", str(store)), capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0 and "failed" in shown.stdout, shown.stdout + shown.stderr
