"""``dtpo train --grid-signal``: bad input is one line before anything starts; on virtual GPUs the power limit
follows Throttle's choices on a real trace (replayed fast), every rank alike, and comes back at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal as signal_module
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, dtpo_cli, run_cli
from fakes import FakeNvml

from dtpo.tune.grid_policy import GridJob, GridSetting, Throttle

UK_TRACE = REPO / "benchmarks" / "data" / "uk_carbon_intensity_2023-03-14_19.csv"  # 2023-03-14 01:00 to 03-19


@pytest.fixture
def no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose NVML answers with no GPU (whatever this one has)."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    monkeypatch.delenv("DTPO_VIRTUAL_GPUS", raising=False)


def _unsorted(tmp_path: Path) -> str:
    path = tmp_path / "unsorted.csv"
    path.write_text("time,value\n2023-03-14T01:30Z,80\n2023-03-14T01:00Z,90\n")
    return str(path)


@pytest.mark.parametrize(("flags", "said"), [
    (["--grid-signal", str(UK_TRACE), "--grid-policy", "pause", "--deadline", "5", "--tune", "power-limit"],
     "--grid-policy pause schedules the whole run against the signal; drop --tune power-limit"),
    (["--grid-signal", str(UK_TRACE), "--grid-policy", "pause", "--deadline", "5"],  # on the clock, as throttle
     "signal covers 2023-03-14T01:00Z to 2023-03-19"),
    (["--deadline", "5"], "--deadline schedules the run against a grid signal: add --grid-signal FILE"),
    (["--grid-signal", str(UK_TRACE)], "grid.deadline_h is needed with --grid-signal"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "5", "--tune", "power-limit"],
     "--grid-signal chooses the GPUs' power limit itself; drop --tune"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "5", "--power-limit", "200"],
     "--grid-signal chooses the GPUs' power limit itself; drop --power-limit"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "0", "--grid-replay", "60"], "grid.deadline_h must be positive"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "2", "--grid-replay", "-1"], "grid.replay must be positive"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "5"],  # on the clock: a 2023 trace does not cover today
     "signal covers 2023-03-14T01:00Z to 2023-03-19"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "200", "--grid-replay", "60"],  # longer than the trace
     "but --deadline 200 runs from 2023-03-14T01:00Z"),
    (["--grid-signal", "UNSORTED", "--deadline", "1", "--grid-replay", "60"], "times are not sorted"),
    (["--grid-signal", "/nonexistent/signal.csv", "--deadline", "1"], "cannot read it"),
    (["--grid-signal", str(UK_TRACE), "--deadline", "5", "--grid-replay", "60"],
     "--grid-signal moves the GPUs' power limit and this machine has no GPU whose limit dtpo can reach"),
])
def test_bad_grid_input_is_one_line_before_launch(flags: list[str], said: str, tmp_path: Path, no_gpus: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    flags = [_unsorted(tmp_path) if f == "UNSORTED" else f for f in flags]
    code, _, err = run_cli(["train", "--workload", "mlp", "--steps", "10", "--run-dir", str(tmp_path / "run"),
                            *flags], capsys)
    assert code == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@pytest.mark.slow
def test_on_virtual_gpus_the_limit_follows_throttle_and_comes_back(tmp_path: Path) -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler to build the NVML stand-in")
    from dtpo.devices.virtual_nvml import ENV
    from dtpo.devices.virtual_nvml import state as st
    from dtpo.devices.virtual_nvml.make import create

    made = create(tmp_path / "vgpu", gpu="A40", count=2, root=True, log_calls=True, slow_steps=True)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {ENV: str(made.directory), "DTPO_STATE_DIR": str(tmp_path / "state")}
    run_dir = tmp_path / "run"
    done = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--steps", "300", "--window-steps", "5",
                                   "--grid-signal", str(UK_TRACE), "--deadline", "47", "--grid-replay", "600",
                                   "--run-dir", str(run_dir), "--no-report", "--no-trace"),
                          env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grid signal" in done.stdout and "against signal-blind (estimate)" in done.stdout
    record = json.loads((run_dir / "record.json").read_text())
    sections = [rank["grid"] for rank in record["ranks"]]
    limits = [[s["power_limit_w"] for s in section["intervals"]] for section in sections]
    assert limits[0] == limits[1] and sections[0]["settings"] == sections[1]["settings"]  # every rank decided alike
    section = sections[0]
    assert [s["power_limit_w"] for s in section["settings"]] == [300.0, 250.0, 200.0, 150.0]
    assert section["source"] == "simulated" and section["outcome"]["deadline_met"]

    # each limit held after the sweep is Throttle's choice on the recorded figures and the trace's forecast
    settings = [GridSetting(f"{s['power_limit_w']:g} W", s["power_limit_w"], s["time_per_sample_s"],
                            s["energy_per_sample_j"]) for s in section["settings"]]
    job = GridJob(section["job"]["samples"], section["job"]["deadline_s"], section["job"]["interval_s"])
    forecast = np.array([float(line.split(",")[1]) for line in UK_TRACE.read_text().splitlines()[1:]])
    held = [s for s in section["intervals"] if s["phase"] == "throttle"]
    assert held
    for segment in held:
        choice = Throttle(settings, job).decide(segment["interval"], segment["decision"]["done"], forecast)
        assert segment["power_limit_w"] == settings[choice].power_limit_w, segment

    # each GPU got the limits of the record, in order, and its default back at the end
    rows = [line.split() for line in (made.directory / st.CALL_LOG).read_text().splitlines()]
    distinct = [w for i, w in enumerate(limits[0]) if i == 0 or w != limits[0][i - 1]]
    for gpu in (0, 1):
        sets = [int(r[3]) / 1000 for r in rows if r[1] == "nvmlDeviceSetPowerManagementLimit" and r[4] == "0"
                and int(r[2]) == gpu]
        assert sets[:-1] == distinct and sets[-1] == 300.0
    with st.locked(made.directory / st.STATE_FILE) as state:
        assert [state.gpus[i].limit_mw for i in range(state.count)] == [300_000, 300_000]
    assert not (tmp_path / "state" / "knobs-journal.json").exists()


def _dirty_middle(path: Path) -> Path:
    """Half-hour intervals from 2024-01-01: clean, very dirty for half an hour, then clean for the rest of a day (a
    CPU's modelled power idle is most of its power busy: only a dirty interval 40x the clean ones pays for holding
    still through it)."""
    values = [100, 4000] + [100] * 46
    lines = ["time,value"] + [f"2024-01-01T{k // 2:02d}:{30 * (k % 2):02d}Z,{v}" for k, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _pause_run(signal: Path, run_dir: Path, *extra: str) -> list[str]:
    """``dtpo train`` of 160 mlp steps pausing on ``signal``, replayed at 450 signal seconds per wall second (the
    dirty half-hour is a 4 s pause)."""
    return dtpo_cli("train", "--workload", "mlp", "--steps", "160", "--window-steps", "5", "--grid-signal", str(signal),
                    "--grid-policy", "pause", "--grid-replay", "450", "--run-dir", str(run_dir), "--no-report",
                    "--no-trace", *extra)


@pytest.mark.slow
def test_on_cpu_the_run_pauses_through_the_dirty_interval_as_one_run(tmp_path: Path) -> None:
    # 450 signal seconds per wall second: the dirty half-hour is a 4 s pause, longer than the stall floor (3 s)
    signal = _dirty_middle(tmp_path / "signal.csv")
    run_dir = tmp_path / "run"
    done = subprocess.run(_pause_run(signal, run_dir, "--deadline", "6", "--stall-floor", "3"),
                          env={**os.environ, "DTPO_STATE_DIR": str(tmp_path / "state")}, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grid signal" in done.stdout and "paused 1 time" in done.stdout, done.stdout[-2000:]
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "completed" and record["attempt"] == 0 and not record["restarts"]
    sections = [rank["grid"] for rank in record["ranks"]]
    phases = [[(s["interval"], s["phase"]) for s in section["intervals"]] for section in sections]
    assert phases[0] == phases[1]  # every rank paused and resumed together
    paused = {k for k, phase in phases[0] if phase == "paused"}
    assert paused == {1}  # only while dirty
    assert all(phase != "paused" for k, phase in phases[0] if k != 1)
    outcome = sections[0]["outcome"]
    assert outcome["pauses"] == 1 and outcome["deadline_met"] and outcome["paused_energy_j"] > 0
    # the pause saved a checkpoint in the run directory, and its time stays out of the run's measured time
    assert list((run_dir / "checkpoints").glob("step-*"))
    energy = record["ranks"][0]["energy"]
    assert energy["gaps"] and energy["run"]["time_s"] == pytest.approx(
        sum(w["time_s"] for w in energy["windows"]), rel=1e-6)


@pytest.mark.slow
def test_a_worker_lost_during_a_pause_resumes_from_the_pause_checkpoint_with_its_schedule(tmp_path: Path) -> None:
    signal = _dirty_middle(tmp_path / "signal.csv")
    run_dir = tmp_path / "run"
    launched = subprocess.Popen(_pause_run(signal, run_dir, "--deadline", "8", "--max-restarts", "1"),
                                env={**os.environ, "DTPO_STATE_DIR": str(tmp_path / "state")},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launched.poll() is None, launched.communicate()[1][-3000:]
    time.sleep(0.5)  # inside the pause (4 s for the dirty half-hour)
    workers = subprocess.run(["pgrep", "-P", str(launched.pid), "-f", "dtpo.workloads.train"], capture_output=True,
                             text=True).stdout.split()
    assert workers
    os.kill(int(workers[-1]), signal_module.SIGKILL)
    out, err = launched.communicate(timeout=300)
    assert launched.returncode == 0, err[-3000:]
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "completed" and len(record["restarts"]) == 1
    (saved,) = [int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*")
                if int(p.name.removeprefix("step-")) == record["resumed"]["step"]]
    section = record["ranks"][0]["grid"]
    phases = [s["phase"] for s in section["intervals"]]
    assert "paused" in phases and phases.index("resumed") > phases.index("paused")
    resumed = section["intervals"][phases.index("resumed")]
    assert resumed["from_step"] == saved  # the schedule went on from the pause's checkpoint
    assert section["job"]["samples"] == 160 * record["ranks"][0]["steps"][0]["samples"] * 2
    assert section["outcome"]["pauses"] >= 1
