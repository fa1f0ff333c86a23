"""The run lifecycle: a run directory that becomes unwritable costs warnings, not the run or its record."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.record import RECORD_FILE, RunRecord


class BreakRunDir(Callback):
    """After a given step, the run directory is replaced by a file: nothing can be written there anymore."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, session: Any, step_record: Any) -> None:
        if step_record.step == self.at:
            shutil.rmtree(session.run_dir)
            session.run_dir.write_text("not a directory any more")


def _train(run_dir: Path, steps: int, callbacks: Sequence[Callback] = (),
           after_step: Callable[[dtpo.Session], None] | None = None) -> dtpo.Session:
    """A small Session that flushes every 2 steps, trained for ``steps`` steps (``after_step`` after each)."""
    session = dtpo.Session(warmup_steps=1, window_steps=2, flush_every=2, energy=False, progress=False,
                           summary=False, count_flops=False, run_dir=run_dir, callbacks=list(callbacks))
    model = session.wrap(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ((torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(10**6))
    for x, y in session.batches(data, steps=steps):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
        if after_step is not None:
            after_step(session)
    return session


def test_an_unwritable_run_dir_mid_run_keeps_training_and_the_record(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    session = _train(tmp_path / "run", 10, callbacks=[BreakRunDir(2)])
    record = session.finish()
    assert record is not None and record.status == "completed" and len(record.ranks[0].steps) == 10
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dtpo: warning:")]
    assert sum("cannot write the partial record" in w for w in warnings) == 1  # said once, not every flush
    [moved] = [w for w in warnings if "the record went to" in w]
    saved = Path(moved.rsplit("the record went to ", 1)[1])
    assert saved.name == RECORD_FILE and RunRecord.load(saved).status == "completed"
    shutil.rmtree(saved.parent)


def test_flushes_while_training_skip_the_disk_sync_and_the_last_one_syncs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A running rank's partial record is replaced whole (a killed process leaves the old or the new one) without
    waiting for the disk; the flush that ends the rank, and ``record.json``, are synced."""
    from dtpo.core import record as record_module

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(record_module.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    def read_partial(session: dtpo.Session) -> None:
        if session.step_count == 7:
            partial = RunRecord.from_dict(json.loads(session.lifecycle.partial_path.read_text()))
            assert partial.status == "running" and len(partial.ranks[0].steps) >= 5  # flushed, whole

    session = _train(tmp_path / "run", 9, after_step=read_partial)
    assert synced == []
    record = session.finish()
    assert record is not None and len(synced) >= 2  # the completed partial record and record.json among them
    assert RunRecord.load(session.run_dir).status == "completed"
