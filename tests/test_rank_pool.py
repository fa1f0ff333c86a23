"""The pooled ranks behind ``run_ranks``: each call is a fresh world in the same processes, with the test's
environment; a rank that fails ends the pool with its traceback, and the next call gets a new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import run_ranks
from rank_pool import RankFailed


def _note(rank: int, world_size: int, out: str) -> None:
    dist.init_process_group("gloo")
    dist.barrier()  # both ranks are in one world
    Path(out, f"{rank}-{os.getpid()}-{os.environ['POOL_TEST']}-{os.getcwd() == out}").touch()


def _fail_on_rank_1(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo")
    if rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()  # rank 0 would wait here forever: the pool ends it


@pytest.mark.slow
def test_calls_share_the_processes_and_see_the_tests_environment(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for value in ("first", "second"):
        monkeypatch.setenv("POOL_TEST", value)
        run_ranks(_note, 2, str(tmp_path))
    notes = sorted(p.name.split("-") for p in tmp_path.iterdir())
    assert [(rank, value, here) for rank, _, value, here in notes] == [
        ("0", "first", "True"), ("0", "second", "True"), ("1", "first", "True"), ("1", "second", "True")]
    assert notes[0][1] == notes[1][1] and notes[2][1] == notes[3][1]  # the same process for each rank


@pytest.mark.slow
def test_a_failing_rank_raises_its_traceback_and_the_next_call_works(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RankFailed, match="(?s)Process 1 terminated.*ValueError: rank 1 gives up"):
        run_ranks(_fail_on_rank_1, 2)
    monkeypatch.setenv("POOL_TEST", "after")
    run_ranks(_note, 2, str(tmp_path))
    assert len(list(tmp_path.iterdir())) == 2
