"""``--tune`` on the command line: ``dtpo simulate --tune`` prints and records what the tuner did; bad requests
(and ``dtpo train --tune`` without an NVIDIA GPU) are one line, exit 2, nothing left behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_cli as run
from fakes import FakeNvml, FakeNvmlGpu

SIMULATE = ["simulate", "--gpu", "A40", "--workload", "resnet50", "--gpus", "1", "--steps", "2000",
            "--tune", "power-limit", "--cost", "energy"]


def test_simulate_tune_prints_the_settings_visits_choice_and_oracle(state: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SIMULATE, capsys)
    assert code == 0, err
    assert "simulated tuning of the power-limit: 1 x A40" in out and "cost: energy per sample" in out
    for column in ("limit W", "steps", "warm-up", "J/sample", "95 % interval", "status"):
        assert column in out
    assert "chosen" in out
    visits = [line for line in out.splitlines() if line.startswith("visits:")]
    assert len(visits) == 1 and visits[0].startswith("visits: 300 W (") and " -> " in visits[0]
    assert "choice" in out and "oracle" in out and "against the oracle" in out
    assert "All figures are simulated, not measured." in out
    assert "Traceback" not in out + err
    assert not state.exists() or not list(state.rglob("*"))  # no journal, profile or state file left


def test_simulate_tune_json_has_the_tuning_report_and_the_result(state: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tune.json"
    code, out, err = run([*SIMULATE, "--json", str(path)], capsys)
    assert code == 0, err
    assert f"results written to {path}" in out
    data = json.loads(path.read_text())
    assert data["knob"] == "power-limit" and data["cost"] == "energy" and data["gpu"] == "A40"
    tuning, result = data["tuning"], data["result"]
    assert tuning["phase"] == "hold" and tuning["metric"] == "energy"
    assert tuning["choice"] == result["choice"]
    assert [row for row in tuning["settings"] if row["status"] == "chosen"]
    assert 1.0 <= result["cost_ratio"] < 1.05  # the oracle is the best setting of a noise-free sweep
    assert 0 < result["profiling_steps"] < 2000
    assert result["job_cost"] < result["default_job_cost"]  # tuning toward energy saves energy on this trace
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("state", "runs")) == ["tune.json"]


BAD_SIMULATE = [
    (["--tune", "power-limit", "--cost", "bogus"], "unknown cost metric 'bogus'; choose one of: energy, time"),
    (["--tune", "power-limit", "--cost", "zeus:1.5"], "eta must be between 0 and 1, got 1.5"),
    (["--tune", "power-limit", "--cost", "slowdown:0.9"], "slowdown factor must be >= 1"),
    (["--tune", "power-limit", "--cost", "dollars:0.1"], "write dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR"),
    (["--tune", "foo"], "--tune must be one of power-limit, sm-clock, both, got 'foo'"),
    (["--tune", "power-limit", "--sweep", "power-limit"], "--tune chooses the settings itself"),
    (["--tune", "power-limit", "--power-limit", "200"], "--tune chooses the settings itself"),
    (["--tune", "power-limit", "--sm-clock", "1410"], "--tune chooses the settings itself"),
    (["--tune", "power-limit", "--tune-step", "0"], "--tune-step must be > 0 W"),
    (["--tune", "power-limit", "--tune-step", "nan"], "--tune-step must be a finite number"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SIMULATE, ids=[" ".join(a) for a, _ in BAD_SIMULATE])
def test_bad_tune_requests_to_simulate_are_one_line_and_exit_2(args: list[str], message: str, state: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.chdir(out_dir)
    code, out, err = run(["simulate", "--steps", "10", *args, "--json", str(out_dir / "x.json")], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], err
    assert "Traceback" not in out + err
    assert not list(out_dir.iterdir())  # no results file
    assert not state.exists() or not list(state.rglob("*"))


def no_nvidia_driver() -> FakeNvml:
    fake = FakeNvml([FakeNvmlGpu("GPU-0000")])
    fake.init_error = fake.NVMLError_LibraryNotFound()
    return fake


@pytest.mark.parametrize(("pynvml", "why"), [
    (None, "nvidia-ml-py is not installed"),
    (no_nvidia_driver, "NVML library (libnvidia-ml.so.1) not found"),
    (lambda: FakeNvml([]), "NVML sees no GPU on this host"),
], ids=["no pynvml", "no driver", "no GPU"])
def test_train_tune_without_an_nvidia_gpu_points_to_simulate(pynvml: object, why: str, state: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", pynvml() if callable(pynvml) else None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = run(["train", "--tune", "power-limit"], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: --tune power-limit needs an NVIDIA GPU"), err
    assert why in lines[0]
    assert "`dtpo simulate --tune power-limit --cost zeus:0.5` runs the same tuner on simulated GPUs" in lines[0]
    assert "Traceback" not in out + err
    assert not list(work.iterdir())  # no run folder
    assert not state.exists() or not list(state.rglob("*"))


def _nvml_gpu_here() -> bool:
    try:
        from dtpo.devices.nvml import open_nvml_gpus

        gpus = open_nvml_gpus()
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False
    for gpu in gpus:
        gpu.close()
    return True


def test_train_tune_on_this_machine_exits_2_with_one_line(state: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The real pynvml (or none), as installed here."""
    if _nvml_gpu_here():
        pytest.skip("this machine has a usable NVIDIA GPU, so --tune would train")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["train", "--tune", "power-limit", "--cost", "energy"], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "`dtpo simulate --tune power-limit --cost energy`" in lines[0], err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(("args", "message"), [
    (["--cost", "bogus"], "unknown cost metric 'bogus'"),
    (["--power-limit", "200"], "--tune power-limit chooses the GPU settings itself; drop --power-limit"),
    (["--sm-clock", "1410"], "--tune power-limit chooses the GPU settings itself; drop --power-limit / --sm-clock"),
])
def test_train_tune_with_a_bad_cost_or_fixed_knobs_is_refused_first(args: list[str], message: str, state: Path,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([FakeNvmlGpu("GPU-0000")])  # a GPU is there: the request itself is what is wrong
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["train", "--tune", "power-limit", *args], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert fake.calls == []  # no knob touched
