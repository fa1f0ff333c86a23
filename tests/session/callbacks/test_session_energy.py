"""Energy in the Session: counted once per node, windows add up, failures never stop training."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from torch import nn

import dtpo
from dtpo.core.config import EnergyConfig
from dtpo.core.record import RunRecord
from dtpo.devices.base import Device, DeviceError, DeviceInfo
from dtpo.devices.discovery import Discovery
from dtpo.session.callbacks import builtin as builtin_callbacks


def _train(rank: int, world_size: int, out: str) -> None:
    session = dtpo.Session(warmup_steps=1, window_steps=3, progress=False, run_dir=out,
                           energy=EnergyConfig(sample_interval_s=0.05, cpu_tdp_w=20.0))
    torch.manual_seed(0)
    model = session.wrap(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ((torch.randn(16, 32), torch.randint(0, 4, (16,))) for _ in iter(int, 1))
    for x, y in session.batches(data, steps=10):
        session.backward(F.cross_entropy(model(x), y))
        time.sleep(0.03)  # 10 steps outlast several sampler periods (0.05 s), so the power timeline has rows
        session.step(opt)
    session.finish()


@pytest.mark.slow
def test_two_ranks_on_one_node_count_the_cpu_once(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path))
    record = RunRecord.load(tmp_path)
    first, second = record.ranks
    assert [d["name"] for d in first.energy["devices"]] == ["cpu (modelled)", "dram (modelled)"]
    assert second.energy["devices"] == []  # the node's CPU and DRAM are local rank 0's to count
    assert any("counted by local rank 0" in note for note in second.energy["notes"])
    assert record.energy["energy_j"]["value"] == pytest.approx(first.energy["run"]["total_j"])
    assert record.energy["energy_j"]["source"] == "estimated"
    # windows of 3 steps over measured steps 1..9, adjacent, adding up to the run window
    windows = first.energy["windows"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 3), (4, 6), (7, 9)]
    assert sum(w["total_j"] for w in windows) == pytest.approx(first.energy["run"]["total_j"])
    samples = record.totals["samples"]["value"]
    assert record.energy["energy_per_sample_j"]["value"] == pytest.approx(record.energy["energy_j"]["value"] / samples)
    assert (tmp_path / "ranks" / "power-rank00000.csv").read_text().startswith("t_s,cpu (modelled) [W]")


class FailingDevice(Device):
    """Answers a few reads, then its counter vanishes."""

    def __init__(self) -> None:
        self.reads = 0
        self.info = DeviceInfo("gpu-flaky", "gpu", "nvml-counter", False, False)

    def energy_j(self) -> float:
        self.reads += 1
        if self.reads > 3:
            raise DeviceError("the counter vanished")
        return 10.0 * self.reads


def test_a_device_that_fails_mid_run_is_recorded_lost_and_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(builtin_callbacks, "discover",
                        lambda **kwargs: Discovery([FailingDevice()], ["gpu: gpu-flaky via nvml-counter"]))
    with dtpo.Session(warmup_steps=0, progress=False, summary=False, run_dir=tmp_path,
                      window_steps=2,
                      energy=EnergyConfig(sample_interval_s=None)) as session:
        model = session.wrap(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = ((torch.randn(8, 4), torch.randn(8, 1)) for _ in range(10**6))
        for x, y in session.batches(data, steps=8):
            session.backward(F.mse_loss(model(x), y))
            session.step(opt)
    record = RunRecord.load(tmp_path)
    assert record.status == "completed" and len(record.ranks[0].steps) == 8
    assert record.energy["lost"] == {"rank0/gpu-flaky": "the counter vanished"}
    assert "energy of gpu-flaky is no longer measured: the counter vanished" in capsys.readouterr().err


def test_energy_can_be_switched_off(tmp_path: Path) -> None:
    with dtpo.Session(progress=False, summary=False, run_dir=tmp_path, energy=False) as session:
        model = session.wrap(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in session.batches([torch.randn(2, 4)] * 4, steps=4):
            session.backward(model(x).sum())
            session.step(opt)
    record = RunRecord.load(tmp_path)
    assert record.energy is None and record.ranks[0].energy is None
