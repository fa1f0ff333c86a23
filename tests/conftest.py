"""Shared test helpers: run a function on several ranks of a real gloo process group, the dtpo app."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rank_pool import close_pools, run_pooled
from rank_pool import free_port as free_port  # tests import it from here

pytest_plugins = ["agent_steps"]  # the agent tests' `tracked` fixture

REPO = Path(__file__).resolve().parents[1]


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes that form one world (see
    :mod:`rank_pool`: the processes are shared by the tests of the session; each call rendezvous anew).

    ``fn`` must live at module level of a test module so the ranks can import it.
    """
    _note_process_start(f"run_ranks({fn.__name__}, {world_size})")
    run_pooled(fn, world_size, args)


# What the running test started (None: it is marked slow and may). ``make test-fast`` leaves out the tests marked
# slow; a test that starts processes without the mark is an error, so the fast run stays fast.
_started: list[str] | None = None


def _note_process_start(what: str) -> None:
    if _started is not None:
        _started.append(what)


@pytest.fixture(autouse=True)
def _process_starts_are_marked_slow(request: pytest.FixtureRequest,
                                    monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Error out a test that starts a process (a Python subprocess, a multiprocessing child, a rank of
    :func:`run_ranks`) without ``@pytest.mark.slow``."""
    global _started
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    execute_child, start = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start

    def noted_execute_child(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if Path(os.fsdecode(argv[0]).split()[0]).name.startswith("python"):  # not `uname -p` (platform) and such
            _note_process_start(f"subprocess {' '.join(map(os.fsdecode, argv))[:80]}")
        return execute_child(popen, args, *rest, **kwargs)

    def noted_start(process: multiprocessing.process.BaseProcess) -> None:
        _note_process_start(f"multiprocessing {process.name}")
        start(process)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", noted_execute_child)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", noted_start)
    _started = []
    try:
        yield
        started = _started
    finally:
        _started = None
    if started:
        pytest.fail(f"starts processes ({'; '.join(started[:3])}) but is not marked @pytest.mark.slow "
                    "(make test-fast leaves those out)", pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End the pooled ranks with the test session."""
    close_pools()


def dtpo_cli(*args: str) -> list[str]:
    """The command line of the ``dtpo`` console script in this interpreter."""
    return [sys.executable, "-m", "dtpo", *args]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep measured CPU peaks in a per-session folder instead of the user's cache, the runs the tests register in
    a store of the test session's own instead of the project's runs/dtpo.sqlite, and the run directories made
    without --run-dir in the test's own ``tmp_path/runs`` instead of the project's runs/: tests never touch the
    working tree."""
    monkeypatch.setenv("DTPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("DTPO_STORE", str(tmp_path_factory.getbasetemp() / "dtpo.sqlite"))
    monkeypatch.setenv("DTPO_RUN_ROOT", str(tmp_path / "runs"))


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh dtpo state folder (knob journal, profiles) for the test, and wide output (no wrapped tables)."""
    path = tmp_path / "state"
    monkeypatch.setenv("DTPO_STATE_DIR", str(path))
    monkeypatch.setenv("COLUMNS", "200")
    return path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str, str]:
    """Run the ``dtpo`` app in-process on ``argv``: its exit code, stdout and stderr."""
    from dtpo.cli.app import main

    with pytest.raises(SystemExit) as ended:
        main(argv)
    captured = capsys.readouterr()
    return ended.value.code, captured.out, captured.err


def train_behind_a_straggler(session: Any, rank: int, steps: int, lag_s: float, straggler: int = 1) -> None:
    """Train a tiny linear model for ``steps`` steps where rank ``straggler`` gets each batch ``lag_s`` late,
    then finish the session (for tests of what the other ranks learn about waiting)."""
    import time

    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    model = session.wrap(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if session.checkpoints.enabled:
        session.attach(opt)
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))

    def data() -> Any:
        while True:
            if rank == straggler:
                time.sleep(lag_s)
            yield batch

    for x, y in session.batches(data(), steps=steps):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.finish()
