"""Shared test helpers: run a function on several ranks of a real gloo process group."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    import torch

    from dtpo.distributed.worker_exit import exit_now

    torch.set_num_threads(1)
    fn(rank, world_size, *args)
    exit_now(0)  # as dtpo's own workers end: see dtpo.distributed.worker_exit


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes that form one world.

    ``fn`` must live at module level of a test module so the children can import it.
    """
    mp.spawn(_rank_main, args=(fn, world_size, free_port(), args), nprocs=world_size, join=True)


def dtpo_cli(*args: str) -> list[str]:
    """The command line of the ``dtpo`` console script in this interpreter."""
    return [sys.executable, "-m", "dtpo", *args]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep measured CPU peaks in a per-session folder instead of the user's cache, and the runs the tests
    register in a store of the test session's own instead of the project's runs/dtpo.sqlite."""
    monkeypatch.setenv("DTPO_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("DTPO_STORE", str(tmp_path_factory.getbasetemp() / "dtpo.sqlite"))


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
