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


def test_the_exit_waits_for_runnable_threads_then_goes_on() -> None:
    """settle_native_threads looks until two looks in a row find no other runnable thread, then returns True."""
    import torch.distributed  # noqa: F401 - the wait only matters once it was imported

    from dtpo.distributed.worker_exit import settle_native_threads

    looks = iter([["R", "S"], ["S"], ["R"], ["S", "S"], ["S"]])
    seen: list[int] = []

    def states() -> list[str]:
        seen.append(1)
        return next(looks)

    assert settle_native_threads(cap_s=5.0, slice_s=0.0, states=states)
    assert len(seen) == 5  # the quiet look after a runnable one does not count twice


def test_the_exit_gives_up_on_threads_that_stay_runnable() -> None:
    import torch.distributed  # noqa: F401

    from dtpo.distributed.worker_exit import settle_native_threads

    assert not settle_native_threads(cap_s=0.05, slice_s=0.001, states=lambda: ["R"])


def test_the_exit_does_not_wait_without_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.distributed.worker_exit import settle_native_threads

    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert settle_native_threads(cap_s=5.0, states=lambda: pytest.fail("looked without torch.distributed"))


def test_a_thread_busy_in_native_code_reads_as_runnable() -> None:
    """The real look at /proc: a thread hashing (which releases the GIL) is seen runnable at some look."""
    import hashlib
    import threading
    import time

    from dtpo.distributed.worker_exit import _other_thread_states

    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc on this system")
    stop = threading.Event()
    data = b"x" * (16 << 20)

    def busy() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10.0
        seen = False
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
            seen = "R" in _other_thread_states()
    finally:
        stop.set()
        thread.join()
    assert seen
