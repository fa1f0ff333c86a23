"""Callbacks see every step and window in order; settings switched between steps apply from the next step."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.record import RunRecord, rank_record_path
from dtpo.core.steps import Window
from dtpo.session.loop.divergence import DivergedError


class Recorder(Callback):
    """Writes down every hook call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.windows: list[Window] = []

    def on_train_start(self, session: Any) -> None:
        self.calls.append(("train_start", None))

    def on_step_begin(self, session: Any, step: int) -> None:
        self.calls.append(("step_begin", step))

    def on_step_end(self, session: Any, step_record: Any) -> None:
        self.calls.append(("step_end", step_record.step))

    def on_window_end(self, session: Any, window: Window) -> None:
        self.calls.append(("window_end", (window.first_step, window.last_step)))
        self.windows.append(window)

    def on_rank_end(self, session: Any, rank_record: Any) -> None:
        self.calls.append(("rank_end", len(rank_record.steps)))

    def on_train_end(self, session: Any, record: Any) -> None:
        self.calls.append(("train_end", record.status if record else None))


def _data(batch: int = 8):
    while True:
        yield torch.randn(batch, 6), torch.randint(0, 3, (batch,))


def _session(tmp_path: Path, **kwargs: Any) -> dtpo.Session:
    kwargs.setdefault("energy", False)
    return dtpo.Session(progress=False, summary=False, run_dir=tmp_path, count_flops=False, **kwargs)


def test_a_callback_sees_every_step_and_window_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    session = _session(tmp_path, warmup_steps=2, window_steps=3, callbacks=[recorder])
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(_data(), steps=10):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.finish()
    expected: list[tuple[str, Any]] = [("train_start", None)]
    for step in range(10):
        expected += [("step_begin", step), ("step_end", step)]
        if step in (4, 7):
            expected.append(("window_end", (step - 2, step)))
    expected += [("window_end", (8, 9)), ("rank_end", 10), ("train_end", "completed")]
    assert recorder.calls == expected
    assert [w.index for w in recorder.windows] == [0, 1, 2]
    assert all(w.samples == 8 * w.steps and w.time_s > 0 for w in recorder.windows)
    assert recorder.windows[0].settings == {"precision": "32-true", "grad_accum": 1, "compression": "none"}
    assert recorder.windows[0].energy_j == {} and recorder.windows[0].joules_per_sample is None


class Beginnings(Callback):
    """Writes down the steps it was told begin."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step_begin(self, session: Any, step: int) -> None:
        self.steps.append(step)


@pytest.mark.parametrize("how", ["appended", "replaced"])
def test_a_callback_added_mid_run_is_told_of_the_next_step_begin(tmp_path: Path, how: str) -> None:
    session = _session(tmp_path, warmup_steps=1, window_steps=4)  # no step-begin listener: the Session skips the call
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    late = Beginnings()
    for x, y in session.batches(_data(), steps=8):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
        if session.step_count == 5:  # mid-window
            if how == "appended":
                session.callbacks.append(late)
            else:  # a new list of the same length, the last callback swapped for it
                session.callbacks = [*session.callbacks[:-1], late]
    session.finish()
    assert late.steps == [5, 6, 7]


def test_windows_carry_energy_when_it_is_measured(tmp_path: Path) -> None:
    recorder = Recorder()
    session = _session(tmp_path, warmup_steps=1, window_steps=2, callbacks=[recorder],
                       energy=dtpo.EnergyConfig(sample_interval_s=None, cpu_tdp_w=20.0))
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(_data(), steps=5):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    record = session.finish()
    assert [(w.first_step, w.last_step) for w in recorder.windows] == [(1, 2), (3, 4)]
    assert all(w.total_j is not None and w.total_j > 0 and w.estimated for w in recorder.windows)
    run = record.ranks[0].energy["run"]
    assert sum(w.total_j for w in recorder.windows) == pytest.approx(run["total_j"])


def test_close_window_ends_the_open_window_at_once_so_later_work_counts_in_none(tmp_path: Path) -> None:
    recorder = Recorder()
    session = _session(tmp_path, warmup_steps=1, window_steps=3, callbacks=[recorder])
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(_data(), steps=6):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.close_window()
    recorder.calls.append(("after the last step", None))  # an evaluation would run here
    session.close_window()  # nothing open: no empty window
    session.finish()
    assert recorder.calls[-5:] == [("step_end", 5), ("window_end", (4, 5)), ("after the last step", None),
                                   ("rank_end", 6), ("train_end", "completed")]
    assert [(w.first_step, w.last_step) for w in recorder.windows] == [(1, 3), (4, 5)]


class SwitchAt(Callback):
    """Changes settings when a given step ends, and records how each later forward ran."""

    def __init__(self, at: int, **settings: Any) -> None:
        self.at = at
        self.settings = settings

    def on_step_end(self, session: Any, step_record: Any) -> None:
        if step_record.step == self.at:
            if "precision" in self.settings:
                session.set_precision(self.settings["precision"])
            if "grad_accum" in self.settings:
                session.set_grad_accum(self.settings["grad_accum"])


class Probe(nn.Module):
    """A linear layer that remembers whether autocast was on and the dtype its matmul produced."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 3)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.seen.append(out.dtype)
        return out


def test_precision_and_accumulation_switched_between_steps_apply_from_the_next_step(tmp_path: Path) -> None:
    session = _session(tmp_path, warmup_steps=0, callbacks=[SwitchAt(2, precision="bf16-mixed", grad_accum=2)])
    probe = Probe()
    model = session.wrap(probe)
    assert "forward" not in vars(model)  # in 32-true the model's own forward runs, with no wrapper around it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(_data(), steps=5):
        out = model(x)
        assert out.dtype == torch.float32  # outputs come back in float32 for the loss
        session.backward(F.cross_entropy(out, y))
        session.step(opt)
    record = session.finish()
    steps = record.ranks[0].steps
    assert [s.samples for s in steps] == [8, 8, 8, 16, 16]  # two micro-batches per step from step 3
    assert probe.seen[:3] == [torch.float32] * 3
    assert probe.seen[3:] == [torch.bfloat16] * 4
    assert session.switches["precision"].value == "bf16-mixed" and session.switches["precision"].changes_numerics
    assert session.switches["grad_accum"].value == 2
    assert session.switch_log == [{"step": 3, "setting": "precision", "value": "bf16-mixed"},
                                  {"step": 3, "setting": "grad_accum", "value": 2}]


def test_switching_inside_an_accumulation_window_is_refused(tmp_path: Path) -> None:
    session = _session(tmp_path, grad_accum=2)
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="only between optimizer steps"):
        for x, y in session.batches(_data(), steps=2):
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
            session.set_precision("bf16-mixed")  # after the first micro-step of two
    session.finish()


def test_compression_needs_ddp_with_several_processes(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.wrap(nn.Linear(6, 3))
    session.set_compression("none")
    with pytest.raises(dtpo.core.errors.ConfigError, match="needs DDP with more than one process"):
        session.set_compression("fp16")
    session.finish()


def _diverge(session: dtpo.Session, at: int, stop_after: int | None = None) -> int:
    """Train up to 10 steps, the loss NaN at step ``at``, leaving the loop after ``stop_after``; expects the run to
    end diverged at ``at``. Returns the last step the loop began."""
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach(opt)
    step = -1
    with pytest.raises(DivergedError, match=f"loss became nan at step {at} on rank 0"), session:
        for step, (x, y) in enumerate(session.batches(_data(), steps=10)):
            loss = F.cross_entropy(model(x), y)
            session.backward(loss * math.nan if step == at else loss)
            session.step(opt)
            if step == stop_after:
                break
    return step


def test_a_loss_that_is_not_a_number_stops_the_run_as_diverged(tmp_path: Path) -> None:
    _diverge(_session(tmp_path, warmup_steps=0), 3)
    partial = RunRecord.load(rank_record_path(tmp_path, 0))
    assert partial.status == "diverged"
    assert "loss became nan at step 3" in partial.error
    assert len(partial.ranks[0].steps) == 4


class WindowReader(Recorder):
    """A Recorder that only reads the records: they may come together as their window closes."""

    live_step_end = False


def _train(session: dtpo.Session, steps: int, losses: list[float] | None = None) -> None:
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(_data(), steps=steps):
        loss = F.cross_entropy(model(x), y)
        if losses is not None:
            losses.append(loss.item())
        session.backward(loss)
        session.step(opt)


def test_records_of_a_window_come_together_when_no_callback_wants_each_step(tmp_path: Path) -> None:
    reader = WindowReader()
    session = _session(tmp_path, warmup_steps=1, window_steps=3, callbacks=[reader])
    losses: list[float] = []
    _train(session, 7, losses)
    session.finish()
    # the warm-up step and the first measured one as they end; later ones just before their window closes
    assert reader.calls == [("train_start", None), ("step_begin", 0), ("step_end", 0), ("step_begin", 1),
                            ("step_end", 1), ("step_begin", 2), ("step_begin", 3), ("step_end", 2),
                            ("step_end", 3), ("window_end", (1, 3)), ("step_begin", 4), ("step_begin", 5),
                            ("step_begin", 6), ("step_end", 4), ("step_end", 5), ("step_end", 6),
                            ("window_end", (4, 6)), ("rank_end", 7), ("train_end", "completed")]
    steps = session.lifecycle.rank.steps
    assert [s.step for s in steps] == list(range(7))
    assert [s.loss for s in steps] == pytest.approx(losses)
    assert all(s.step_s > 0 and s.compute_s > 0 and s.samples == 8 and s.started_at is not None for s in steps)
    assert [s.warmup for s in steps] == [True] + [False] * 6


def test_one_callback_that_wants_each_step_gets_every_record_as_its_step_ends(tmp_path: Path) -> None:
    live, reader = Recorder(), WindowReader()
    session = _session(tmp_path, warmup_steps=1, window_steps=3, callbacks=[live, reader])
    _train(session, 7)
    session.finish()
    assert live.calls == reader.calls
    assert live.calls[5:9] == [("step_begin", 2), ("step_end", 2), ("step_begin", 3), ("step_end", 3)]


def test_reading_the_rank_record_brings_in_the_waiting_steps(tmp_path: Path) -> None:
    session = _session(tmp_path, warmup_steps=0, window_steps=100)
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for x, y in session.batches(_data(), steps=5):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
        seen.append(len(session.lifecycle.rank.steps))
        assert session.rank_record.steps[-1].step == len(seen) - 1
    session.finish()
    assert seen == [1, 1, 2, 3, 4]  # the first measured step's record as it ends; each later one waits


def test_a_loop_left_early_with_a_waiting_step_that_diverged_ends_as_diverged(tmp_path: Path) -> None:
    _diverge(_session(tmp_path, warmup_steps=0, window_steps=100), 2, stop_after=4)
    partial = RunRecord.load(rank_record_path(tmp_path, 0))
    assert partial.status == "diverged"
    assert [s.step for s in partial.ranks[0].steps] == [0, 1, 2]  # what came after the NaN is dropped


def test_a_checkpoint_checks_the_waiting_steps_first_and_never_saves_a_run_that_diverged(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    session = _session(tmp_path / "run", warmup_steps=0, window_steps=100,
                       checkpoint=dtpo.CheckpointConfig(every="4", dir=str(folder)))
    assert _diverge(session, 2) == 3  # raised by the save due after step 3, before it wrote anything
    assert not folder.exists() or not any(folder.iterdir())
