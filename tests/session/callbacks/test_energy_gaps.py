"""The energy callback keeps a span between windows (a grid pause) out of the run, and records it apart."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from fakes import FakeGpu

from dtpo.core.record import RankRecord
from dtpo.core.steps import Window
from dtpo.devices.discovery import Discovery
from dtpo.session.callbacks.energy import EnergyCallback


class CountingGpu(FakeGpu):
    """A GPU whose energy counter the test moves."""

    def __init__(self) -> None:
        super().__init__()
        self.joules = 0.0

    def energy_j(self) -> float:
        return self.joules


def window(index: int) -> Window:
    return Window(index, index, index, 0.01, 8, 0.01)


def test_a_gap_is_kept_out_of_the_run_and_recorded_apart() -> None:
    gpu = CountingGpu()
    energy = EnergyCallback(Discovery([gpu]), warmup_steps=0, sample_interval_s=None)
    session = SimpleNamespace(start_step=0, rank_record=RankRecord(rank=0, local_rank=0, node="n", device="cpu"))
    assert energy.skip_gap() is None  # before the run window opens there is nothing to keep out
    energy.on_step_begin(session, 0)
    gpu.joules = 10.0
    first = window(0)
    energy.on_window_end(session, first)
    gpu.joules = 15.0  # idle during a pause
    time.sleep(0.05)
    gap = energy.skip_gap()
    assert gap is not None and gap.total_j == pytest.approx(5.0) and gap.time_s >= 0.05
    gpu.joules = 35.0
    second = window(1)
    energy.on_window_end(session, second)
    energy.close()
    section = energy.section()
    assert first.energy_j == {"gpu0": 10.0} and second.energy_j == {"gpu0": 20.0}  # the next window starts after it
    assert section["run"]["total_j"] == pytest.approx(30.0)
    assert section["run"]["time_s"] == pytest.approx(sum(w["time_s"] for w in section["windows"]))
    assert [g["total_j"] for g in section["gaps"]] == [pytest.approx(5.0)]
