"""``--tune`` as a Session callback, on a fake NVML GPU driven by hand through a convex time/power model.

Each test plays a "training run": ``on_step_begin``, then the fake clock and the fake GPU's energy counter
advance by the step time and power that the GPU's *current* power limit gives (a model written here, with a
clear energy optimum inside the fake's 100-300 W range, plus small seeded noise), then ``on_step_end``; a while
after the tuner holds its choice, ``on_rank_end``. The knob calls the callback makes reach the fake pynvml, which
logs them in order.
"""

from __future__ import annotations

import json
import logging
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from fakes import FakeNvml, FakeNvmlGpu

from dtpo.core.config import TuneConfig
from dtpo.core.record_sections import PowerTuning
from dtpo.devices.nvml import NvmlGpu, open_nvml_gpus
from dtpo.devices.physics.power_specs import match_power_spec
from dtpo.session.tuning.power import TuneCallback

UUID = "GPU-7e57aaaa-0000-0000-0000-000000000000"
MIN_MW, MAX_MW = 100_000, 300_000
GRID_MW = list(range(MIN_MW, MAX_MW + 1, 25_000))  # every multiple of 25 W from the minimum to the maximum
SAMPLES = 32  # per step
T0_S = 0.1  # step time while the limit does not bite
KNEE_W = 205.0  # below this limit the GPU slows down
DRAW_W = 240.0  # what the GPU draws when nothing caps it


def step_model(limit_w: float) -> tuple[float, float]:
    """Step time and power at a power limit: power follows the cap down to the GPU's own draw; below the knee the
    step slows faster than power falls, so energy per step is lowest just below the knee (205 W)."""
    time_s = T0_S * (1 + 0.8 * max(0.0, KNEE_W - limit_w) / 100) ** 1.5
    return time_s, min(limit_w, DRAW_W)


def energy_optimum_w() -> float:
    """The model's energy optimum over the whole range, on a fine grid."""
    limits = np.arange(MIN_MW / 1000, MAX_MW / 1000 + 1e-9, 0.5)
    energy = [step_model(w)[0] * step_model(w)[1] for w in limits]
    return float(limits[int(np.argmin(energy))])


def test_the_model_has_a_clear_optimum_inside_the_range() -> None:
    best = energy_optimum_w()
    assert best == KNEE_W and MIN_MW / 1000 < best < MAX_MW / 1000
    energy = {mw: step_model(mw / 1000)[0] * step_model(mw / 1000)[1] for mw in GRID_MW}
    ranked = sorted(energy, key=energy.get)
    assert ranked[0] == 200_000 and energy[ranked[1]] > 1.05 * energy[ranked[0]]  # 5 % ahead of the next


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, state: Path) -> FakeNvml:
    """One fake H100 with a 100-300 W power-limit range, at 300 W; it notes whether the journal exists at every
    change."""
    fake = FakeNvml([FakeNvmlGpu(UUID, limit_mw=MAX_MW, limit_range_mw=(MIN_MW, MAX_MW), default_limit_mw=MAX_MW)],
                    journal_path=state / "knobs-journal.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return fake


@pytest.fixture
def gpus(nvml: FakeNvml) -> Iterator[list[NvmlGpu]]:
    opened = open_nvml_gpus()
    assert len(opened) == 1 and opened[0].knob_key == f"nvml:{UUID}"
    yield opened
    for gpu in opened:
        gpu.close()
    assert nvml.refs == 0


class Job:
    """A hand-driven training run of one rank on the fake GPU, with its own clock and noise."""

    def __init__(self, nvml: FakeNvml, seed: int = 0, workload: str = "toy-mlp",
                 model: Callable[[float], tuple[float, float]] = step_model) -> None:
        self.nvml = nvml
        self.model = model
        self.now = 0.0
        self.rng = random.Random(seed)
        self.steps = 0
        self.held_at: int | None = None
        rank = SimpleNamespace(steps=[], flops_per_step=2.5e12, tuning=None)
        self.session = SimpleNamespace(
            rank=0, world_size=1, ctx=SimpleNamespace(distributed=False), device=torch.device("cpu"),
            lifecycle=SimpleNamespace(rank=rank), config=SimpleNamespace(precision="bf16-mixed"),
            run_config=SimpleNamespace(workload=SimpleNamespace(name=workload)), target_steps=1000)

    def clock(self) -> float:
        return self.now

    def step(self, cb: TuneCallback, warmup: bool = False) -> None:
        """One training step at whatever limit the fake GPU has now."""
        cb.on_step_begin(self.session, self.steps)
        gpu = self.nvml.gpus[0]
        time_s, power_w = self.model(gpu.limit_mw / 1000)
        time_s *= 1 + self.rng.gauss(0.0, 0.01)
        power_w *= 1 + self.rng.gauss(0.0, 0.01)
        self.now += time_s
        assert gpu.energy_mj is not None
        gpu.energy_mj += int(round(power_w * time_s * 1000))
        record = SimpleNamespace(step=self.steps, warmup=warmup, samples=SAMPLES)
        self.session.lifecycle.rank.steps.append(record)  # as the Session does, before on_step_end
        cb.on_step_end(self.session, record)
        self.steps += 1

    def train(self, cb: TuneCallback, after_hold: int = 20, max_steps: int = 400, warmup: int = 2,
              until: Callable[[], bool] | None = None) -> None:
        """Start, the Session's warm-up steps, then steps until ``after_hold`` steps past holding (or ``until``)."""
        cb.on_train_start(self.session)
        for _ in range(warmup):
            self.step(cb, warmup=True)
        while self.steps < max_steps:
            self.step(cb)
            if self.held_at is None and cb.tuner is not None and cb.tuner.holding:
                self.held_at = self.steps
            if until is not None and until():
                return
            if self.held_at is not None and self.steps >= self.held_at + after_hold:
                return

    def finish(self, cb: TuneCallback) -> dict[str, Any]:
        rank = self.session.lifecycle.rank
        cb.on_rank_end(self.session, rank)
        assert isinstance(rank.tuning, PowerTuning)
        report = rank.tuning.to_dict()
        json.dumps(report)  # it goes into record.json as it is
        return report


@pytest.fixture
def make_callback() -> Iterator[Callable[..., TuneCallback]]:
    """Callbacks built here are restored at teardown whatever happens (their controllers hold signal handlers)."""
    made: list[TuneCallback] = []

    def make(job: Job, mode: str = "apply", gpus: list[Any] | None = None, **config: Any) -> TuneCallback:
        config.setdefault("knob", "power-limit")
        config.setdefault("cost", "energy")
        cb = TuneCallback(TuneConfig(**config), mode, gpus if gpus is not None else [], clock=job.clock)
        made.append(cb)
        return cb

    yield make
    for cb in made:
        cb.restore()


def set_calls(nvml: FakeNvml) -> list[int]:
    return [int(call[1]) for call in nvml.calls if call[0] == "set_limit"]  # type: ignore[call-overload]


# -- tuning a real (fake) GPU -------------------------------------------------------------------------------------


def test_a_tuning_run_walks_the_grid_holds_the_energy_optimum_and_restores(
        nvml: FakeNvml, gpus: list[NvmlGpu], state: Path, make_callback: Callable[..., TuneCallback]) -> None:
    job = Job(nvml)
    cb = make_callback(job, gpus=gpus, profile_dir=str(state / "profiles"))
    job.train(cb)
    assert job.held_at is not None, "the tuner never held a choice"
    assert cb.tuner is not None and cb.tuner.choice is not None
    held_mw = int(round(cb.tuner.choice.power_limit_w * 1000))
    assert nvml.gpus[0].limit_mw == held_mw  # the choice is in force while holding
    journal = state / "knobs-journal.json"
    entries = json.loads(journal.read_text())["entries"]
    assert entries[f"nvml:{UUID}"]["original"]["power_limit_w"] == 300.0  # journaled before the first change

    tuning = job.finish(cb)

    # the knob calls: the limit is read (at start, then by the journal before the first change), the candidates
    # are set one change at a time on the 25 W grid, and the original limit comes back last
    assert nvml.calls[:2] == [("get_limit",), ("get_limit",)]
    assert nvml.calls[2][0] == "set_limit"
    assert nvml.calls[-2:] == [("set_limit", MAX_MW), ("unlock",)]
    assert [c for c in nvml.calls if c[0] not in ("set_limit", "get_limit")] == [("unlock",)]
    sets = set_calls(nvml)
    walk = sets[:-1]
    assert walk and all(mw in GRID_MW for mw in walk), walk
    assert all(a != b for a, b in zip(walk, walk[1:], strict=False)), "a setting was re-applied unchanged"
    assert len(set(walk)) >= 3  # several candidates were measured
    assert walk[-1] == held_mw  # the last change before the restore put the choice in force
    assert nvml.journal_seen_at_set and all(nvml.journal_seen_at_set)  # journaled before every change
    assert nvml.gpus[0].limit_mw == MAX_MW
    assert not journal.exists()

    # the held choice is the model's energy optimum within one grid step
    assert abs(held_mw / 1000 - energy_optimum_w()) <= 25.0, (held_mw, walk)

    assert tuning["choice"] == {"power_limit_w": held_mw / 1000, "sm_clock_mhz": None}
    assert tuning["source"] == "measured" and tuning["applied"] is True
    assert tuning["mode"] == "apply" and tuning["knob"] == "power-limit" and tuning["metric"] == "energy"
    assert tuning["phase"] == "hold" and tuning["note"] == ""
    rows = tuning["settings"]
    assert rows and all(int(round(r["power_limit_w"] * 1000)) in GRID_MW for r in rows)
    assert {int(round(r["power_limit_w"] * 1000)) for r in rows} == set(sets[:-1]) | {MAX_MW}
    assert [r["power_limit_w"] for r in rows if r["status"] == "chosen"] == [held_mw / 1000]
    assert 0 < tuning["profiling_steps"] <= job.held_at
    assert tuning["steps"] <= job.steps - 2  # the Session's warm-up steps are not fed to the tuner
    assert "saved" in tuning["profile"] and Path(tuning["profile"]["saved"]).is_file()
    assert Path(tuning["profile"]["saved"]).parent == state / "profiles"
    assert tuning["projected_saving"] is not None and tuning["projected_saving"]["energy_j"] > 0

    cb.on_rank_end(job.session, job.session.lifecycle.rank)  # a second end restores nothing more
    assert set_calls(nvml) == sets


def linear_slowdown_model(limit_w: float) -> tuple[float, float]:
    """Below the GPU's own draw each watt taken away slows the step by the same amount and saves energy all the
    way down: under a slowdown limit the least energy lies at the limit's bound (180 W for 15 %)."""
    return T0_S * (1 + 0.6 * max(0.0, DRAW_W - limit_w) / DRAW_W), min(limit_w, DRAW_W)


def test_a_slowdown_run_sets_a_limit_between_grid_steps_journaled_and_restored(
        nvml: FakeNvml, gpus: list[NvmlGpu], state: Path, make_callback: Callable[..., TuneCallback]) -> None:
    # at most 15 % slower: 200 W is 10 % slower, 175 W 16 %; the search places a whole-watt limit in between
    job = Job(nvml, model=linear_slowdown_model)
    cb = make_callback(job, gpus=gpus, cost="slowdown:1.15")
    job.train(cb)
    assert cb.tuner is not None and cb.tuner.choice is not None
    held_w = cb.tuner.choice.power_limit_w
    tuning = job.finish(cb)
    sets = set_calls(nvml)
    off_grid = [mw for mw in sets if mw not in GRID_MW]
    assert off_grid and all(mw % 1000 == 0 and 175_000 < mw < 200_000 for mw in off_grid), sets
    assert nvml.journal_seen_at_set and all(nvml.journal_seen_at_set)  # journaled before every change
    assert sets[-1] == MAX_MW and nvml.gpus[0].limit_mw == MAX_MW  # the original limit comes back last
    assert 175.0 < held_w < 200.0
    assert linear_slowdown_model(held_w)[0] <= 1.15 * T0_S  # the choice keeps the slowdown limit
    assert tuning["choice"]["power_limit_w"] == held_w
    rows = {r["power_limit_w"]: r for r in tuning["settings"]}
    assert rows[held_w]["status"] == "chosen" and "towards the allowed slowdown" in rows[held_w]["reason"]


def test_the_profile_folder_defaults_to_the_state_dir(nvml: FakeNvml, gpus: list[NvmlGpu], state: Path,
                                                      make_callback: Callable[..., TuneCallback]) -> None:
    job = Job(nvml)
    cb = make_callback(job, gpus=gpus)
    job.train(cb, after_hold=1)
    tuning = job.finish(cb)
    assert Path(tuning["profile"]["saved"]).parent == state / "profiles"


# -- changing nothing: no permission, dry run -----------------------------------------------------------------


def test_no_permission_changes_nothing_goes_on_and_reports_a_model_figure(
        nvml: FakeNvml, gpus: list[NvmlGpu], state: Path, make_callback: Callable[..., TuneCallback],
        caplog: pytest.LogCaptureFixture) -> None:
    assert match_power_spec(nvml.gpus[0].model) is not None  # an H100 by name: there is a power model of it
    nvml.deny = True
    job = Job(nvml)
    cb = make_callback(job, gpus=gpus)
    with caplog.at_level(logging.INFO):
        job.train(cb, max_steps=120)
    assert job.steps == 120  # training went on
    tuning = job.finish(cb)

    assert set_calls(nvml) == [] and all(c == ("get_limit",) for c in nvml.calls)
    assert nvml.gpus[0].limit_mw == MAX_MW
    assert not (state / "knobs-journal.json").exists()
    assert "continuing in observe mode" in caplog.text
    assert tuning["source"] == "model" and tuning["applied"] is False
    assert "the GPUs were not changed" in tuning["note"] and "model figure" in tuning["note"]
    model = tuning["model"]
    assert model["choice"] is not None and model["choice"]["sm_clock_mhz"] is None
    assert "parametric H100-SXM" in model["model"] and model["settings"]
    assert "would choose" in caplog.text
    # what was measured on the real GPU is the default setting only
    assert [r["power_limit_w"] for r in tuning["settings"]] == [300.0]


def test_a_knob_failure_mid_tuning_restores_the_gpu_and_goes_on(
        nvml: FakeNvml, gpus: list[NvmlGpu], state: Path, make_callback: Callable[..., TuneCallback],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Not a permission problem (the GPU fails the second change): the original limit comes back at once and the
    rest of the run changes nothing."""
    real_set = nvml.nvmlDeviceSetPowerManagementLimit
    tries: list[int] = []

    def flaky_set(handle: FakeNvmlGpu, mw: int) -> None:
        tries.append(mw)
        if len(tries) == 2:
            raise nvml.NVMLError_GpuIsLost()
        real_set(handle, mw)

    monkeypatch.setattr(nvml, "nvmlDeviceSetPowerManagementLimit", flaky_set)
    job = Job(nvml)
    cb = make_callback(job, gpus=gpus)
    with caplog.at_level(logging.INFO):
        job.train(cb, max_steps=80)
    assert job.steps == 80
    tuning = job.finish(cb)

    first, failed = tries[:2]
    assert set_calls(nvml) == [first, MAX_MW] and nvml.calls[-1] == ("unlock",)  # restored right after the failure
    assert failed != first and nvml.gpus[0].limit_mw == MAX_MW
    assert not (state / "knobs-journal.json").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GPU is lost" in warnings[0] and "tuning stops" in warnings[0], warnings
    assert tuning["source"] == "model" and tuning["applied"] is False and tuning["note"].startswith("observe mode")


def test_dry_run_only_logs_what_it_would_set(nvml: FakeNvml, gpus: list[NvmlGpu], state: Path,
                                             make_callback: Callable[..., TuneCallback],
                                             caplog: pytest.LogCaptureFixture) -> None:
    job = Job(nvml)
    cb = make_callback(job, mode="dry-run", gpus=gpus)
    with caplog.at_level(logging.INFO):
        job.train(cb, max_steps=60)
    tuning = job.finish(cb)

    assert set_calls(nvml) == [] and nvml.journal_seen_at_set == []
    assert nvml.gpus[0].limit_mw == MAX_MW
    assert not (state / "knobs-journal.json").exists()
    assert tuning["source"] == "model" and tuning["mode"] == "dry-run" and tuning["applied"] is False
    assert tuning["note"].startswith("dry-run mode")
    choice = tuning["model"]["choice"]
    assert choice is not None
    would = [r.getMessage() for r in caplog.records if "would set" in r.getMessage()]
    assert would == [f"knobs: dry run: would set gpu0 ({nvml.gpus[0].model}) power limit "
                     f"{choice['power_limit_w']:g} W"]


# The model figure of dry-run/observe mode must use the GPU's own range: an 'NVIDIA H100 PCIe' takes the H100's
# catalogue figures (the SXM part, 200-700 W) but accepts only 200-350 W.


def busy_model(limit_w: float) -> tuple[float, float]:
    """A job that draws 340 W when nothing caps it (near an H100 PCIe's 350 W maximum)."""
    return step_model(limit_w)[0], min(limit_w, 340.0)


def test_dry_run_on_a_gpu_whose_range_differs_from_its_spec(nvml: FakeNvml,
                                                            make_callback: Callable[..., TuneCallback]) -> None:
    gpu = nvml.gpus[0]
    gpu.model, gpu.limit_mw, gpu.default_limit_mw = "NVIDIA H100 PCIe", 350_000, 350_000
    gpu.limit_range_mw = (200_000, 350_000)
    opened = open_nvml_gpus()
    try:
        job = Job(nvml, model=busy_model)
        cb = make_callback(job, mode="dry-run", gpus=opened, cost="time")
        job.train(cb, max_steps=40)  # got: ConfigError "power limit 700 W is outside the range of gpu0 ..."
        tuning = job.finish(cb)
    finally:
        for device in opened:
            device.close()
    assert 200.0 <= tuning["model"]["choice"]["power_limit_w"] <= 350.0


def test_the_model_choice_is_a_limit_the_gpu_can_take(nvml: FakeNvml, make_callback: Callable[..., TuneCallback]
                                                      ) -> None:
    gpu = nvml.gpus[0]
    gpu.model, gpu.limit_mw, gpu.default_limit_mw = "NVIDIA H100 PCIe", 350_000, 350_000
    gpu.limit_range_mw = (200_000, 350_000)
    nvml.deny = True
    opened = open_nvml_gpus()
    try:
        job = Job(nvml, model=busy_model)
        cb = make_callback(job, gpus=opened)
        job.train(cb, max_steps=40)
        tuning = job.finish(cb)
    finally:
        for device in opened:
            device.close()
    assert tuning["source"] == "model"
    assert 200.0 <= tuning["model"]["choice"]["power_limit_w"] <= 350.0


# -- saved profiles -------------------------------------------------------------------------------------------


def test_a_saved_profile_skips_profiling(nvml: FakeNvml, gpus: list[NvmlGpu], tmp_path: Path,
                                         make_callback: Callable[..., TuneCallback],
                                         caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "profiles"
    first = Job(nvml, seed=1)
    cb = make_callback(first, gpus=gpus, profile_dir=str(folder))
    first.train(cb, after_hold=5)
    report = first.finish(cb)
    saved = Path(report["profile"]["saved"])
    assert saved.parent == folder and saved.is_file() and saved.name == f"{report['profile']['key']}.json"
    assert json.loads(saved.read_text())["schema"] == "dtpo.tune-profile/1"
    choice_mw = int(round(report["choice"]["power_limit_w"] * 1000))
    profiled_steps = report["profiling_steps"]

    nvml.calls.clear()
    again = Job(nvml, seed=2)  # the same job: same GPU, batch, precision, FLOPs, workload, knob and grid
    cb = make_callback(again, gpus=gpus, profile_dir=str(folder))
    with caplog.at_level(logging.INFO):
        again.train(cb, after_hold=5)
    tuning = again.finish(cb)

    # the Session's warm-up, the tuner's wait, one block (0.2 s of these 0.1 s steps)
    assert again.held_at is not None and again.held_at <= 2 + 2 + 2
    assert tuning["profiling_steps"] <= 4 < profiled_steps
    assert tuning["profile"] == {"loaded": str(saved), "key": report["profile"]["key"]}
    assert tuning["choice"] == report["choice"] and tuning["source"] == "measured"
    assert set_calls(nvml) == [choice_mw, MAX_MW]  # straight to the saved optimum, then restored
    assert not any(seg["phase"] in ("warmup", "profile") for seg in tuning["segments"])  # no visits
    assert "without profiling" in caplog.text


def test_fresh_profile_or_another_job_profiles_again(nvml: FakeNvml, gpus: list[NvmlGpu], tmp_path: Path,
                                                     make_callback: Callable[..., TuneCallback]) -> None:
    folder = tmp_path / "profiles"
    first = Job(nvml)
    cb = make_callback(first, gpus=gpus, profile_dir=str(folder))
    first.train(cb, after_hold=1)
    saved = Path(first.finish(cb)["profile"]["saved"])

    for job, extra in ((Job(nvml, seed=3), {"fresh_profile": True}), (Job(nvml, seed=4, workload="other"), {})):
        nvml.calls.clear()
        cb = make_callback(job, gpus=gpus, profile_dir=str(folder), **extra)
        job.train(cb, after_hold=1)
        tuning = job.finish(cb)
        assert "loaded" not in tuning["profile"] and "saved" in tuning["profile"]
        assert len(set(set_calls(nvml))) >= 3  # it visited candidates again
        assert tuning["profiling_steps"] > 5
    assert saved.is_file()  # the fresh run overwrote it in place; the other job has its own file
    assert len(list(folder.glob("*.json"))) == 2


def test_a_corrupt_profile_is_ignored_with_one_warning(nvml: FakeNvml, gpus: list[NvmlGpu], tmp_path: Path,
                                                       make_callback: Callable[..., TuneCallback],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "profiles"
    first = Job(nvml)
    cb = make_callback(first, gpus=gpus, profile_dir=str(folder))
    first.train(cb, after_hold=1)
    saved = Path(first.finish(cb)["profile"]["saved"])
    saved.write_bytes(b"\x00garbage{not json")

    nvml.calls.clear()
    again = Job(nvml, seed=5)
    cb = make_callback(again, gpus=gpus, profile_dir=str(folder))
    with caplog.at_level(logging.INFO):
        again.train(cb, after_hold=1)
    tuning = again.finish(cb)

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert str(saved) in message and "unusable" in message and "profiling again" in message
    assert "\n" not in message
    assert len(set(set_calls(nvml))) >= 3 and tuning["profiling_steps"] > 5
    assert tuning["profile"].get("saved") == str(saved)
    assert json.loads(saved.read_text())["schema"] == "dtpo.tune-profile/1"  # overwritten with a good one


# -- no GPU -------------------------------------------------------------------------------------------------------


def test_no_gpu_warns_once_on_rank_0_and_reports_nothing_applied(
        state: Path, make_callback: Callable[..., TuneCallback], caplog: pytest.LogCaptureFixture) -> None:
    job = Job(FakeNvml([]))
    cb = make_callback(job, gpus=[])
    with caplog.at_level(logging.INFO):
        cb.on_train_start(job.session)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "dtpo simulate --tune power-limit" in warnings[0], warnings
    for i in range(10):
        cb.on_step_begin(job.session, i)
        cb.on_step_end(job.session, SimpleNamespace(step=i, warmup=False, samples=SAMPLES))
    assert cb.tuner is None
    tuning = job.finish(cb)
    assert tuning["applied"] is False and tuning["knob"] == "power-limit" and tuning["metric"] == "energy"
    assert "nothing was tuned" in tuning["note"]
    assert not state.exists()  # no journal, no profile

    caplog.clear()
    other = Job(FakeNvml([]))
    other.session.rank = 1
    cb = make_callback(other, gpus=[])
    with caplog.at_level(logging.INFO):
        cb.on_train_start(other.session)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # one warning per job, from rank 0


def test_a_checkpointed_choice_is_held_again_after_a_resume(nvml: FakeNvml, gpus: list[NvmlGpu], tmp_path: Path,
                                                           make_callback: Callable[..., TuneCallback]) -> None:
    first = Job(nvml, seed=1)
    cb = make_callback(first, gpus=gpus, profile_dir=str(tmp_path / "profiles"))
    assert cb.state_dict() == {"settings": None}  # nothing to keep before the search
    first.train(cb, after_hold=3)
    state = json.loads(json.dumps(cb.state_dict()))  # plain data, as a checkpoint keeps it
    assert cb.tuner is not None and cb.tuner.choice is not None
    choice = cb.tuner.choice
    cb.restore()  # the worker is gone; its GPU back at 300 W

    nvml.calls.clear()
    resumed = Job(nvml, seed=2)
    cb = make_callback(resumed, gpus=gpus, profile_dir=str(tmp_path / "elsewhere"), fresh_profile=True)
    cb.on_train_start(resumed.session)
    cb.load_state_dict(state)
    assert cb.tuner is not None and cb.tuner.holding and cb.tuner.choice == choice and cb.applied == choice
    assert nvml.gpus[0].limit_mw == int(round(choice.power_limit_w * 1000))  # applied again at once
    assert cb.profile["resumed_from_checkpoint"] is True
