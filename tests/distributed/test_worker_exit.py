"""A worker ends through run_then_exit as Python would end it (threads joined, atexit run, output flushed,
the exit code kept), without the interpreter's finalisation."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from dtpo.distributed.worker_exit import exit_code

WORKER = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from dtpo.distributed.worker_exit import run_then_exit

out = Path(sys.argv[1])

def late_writer():
    time.sleep(0.2)
    (out / "thread.txt").write_text("joined")

def main():
    atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
    threading.Thread(target=late_writer).start()
    executor = ThreadPoolExecutor(2)  # never shut down: its idle workers must not hold the exit up
    executor.submit(lambda: (out / "task.txt").write_text("done")).result()
    main.executor = executor
    sys.stdout.write("no newline, still buffered")
    how = sys.argv[2]
    if how == "code":
        sys.exit(3)
    if how == "message":
        sys.exit("stopped: a message")
    if how == "error":
        raise ValueError("an error escapes as before")

run_then_exit(main)
"""


def run_worker(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.run([sys.executable, str(script), str(tmp_path), how], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("how,code", [("return", 0), ("code", 3), ("message", 1)])
def test_a_worker_ends_with_its_code_after_threads_atexit_and_output(tmp_path: Path, how: str, code: int) -> None:
    done = run_worker(tmp_path, how)
    assert done.returncode == code, done.stderr
    assert done.stdout == "no newline, still buffered"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "task.txt").read_text() == "done"
    assert ("stopped: a message" in done.stderr) == (how == "message")


@pytest.mark.slow
def test_an_exception_escaping_main_is_left_to_python(tmp_path: Path) -> None:
    done = run_worker(tmp_path, "error")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ValueError: an error escapes as before" in done.stderr
    assert (tmp_path / "atexit.txt").read_text() == "ran"  # Python's own exit, which runs atexit too


def test_exit_codes_follow_system_exit(caplog: pytest.LogCaptureFixture) -> None:
    assert exit_code(None) == 0 and exit_code(0) == 0 and exit_code(7) == 7
    with caplog.at_level(logging.ERROR, logger="dtpo.distributed.worker_exit"):
        assert exit_code("why") == 1
    assert [r.getMessage() for r in caplog.records] == ["why"]
