"""End to end on virtual GPUs: tuning, monitoring, a lost GPU, and a restore after kill -9, all through the real
nvidia-ml-py binding and dtpo's NVML stand-in."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import dtpo_cli, free_port, run_cli

from dtpo.devices.virtual_nvml import ENV
from dtpo.devices.virtual_nvml import state as st
from dtpo.devices.virtual_nvml.make import create, inject

pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
pytestmark = pytest.mark.slow
if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
    pytest.skip("no C compiler to build the NVML stand-in (install gcc)", allow_module_level=True)

A40_DEFAULT_MW = 300_000


def _env(tmp_path: Path, directory: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return env | {ENV: str(directory), "DTPO_STATE_DIR": str(tmp_path / "state")}


def _sets(directory: Path) -> list[tuple[int, int, int]]:
    """(pid, gpu, milliwatts) of every successful nvmlDeviceSetPowerManagementLimit, in order."""
    rows = [line.split() for line in (directory / st.CALL_LOG).read_text().splitlines()]
    return [(int(r[0]), int(r[2]), int(r[3])) for r in rows if r[1] == "nvmlDeviceSetPowerManagementLimit"
            and r[4] == "0"]


def _limits_mw(directory: Path) -> list[int]:
    with st.locked(directory / st.STATE_FILE) as state:
        return [state.gpus[i].limit_mw for i in range(state.count)]


def test_a_tuning_run_goes_through_the_binding_and_says_simulated(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="A40", count=2, root=True, log_calls=True, slow_steps=True)
    run_dir = tmp_path / "run"
    done = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--steps", "240", "--tune", "power-limit",
                                   "--run-dir", str(run_dir), "--no-report", "--no-trace"),
                          env=_env(tmp_path, made.directory), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "record.json").read_text())
    for rank in record["ranks"]:
        gpus = [d for d in rank["energy"]["devices"] if d["kind"] == "gpu"]
        assert len(gpus) == 1 and gpus[0]["source"] == "simulated" and gpus[0]["estimated"]
        assert "simulated, not measured" in gpus[0]["detail"]
        assert any(note.startswith("step time: includes a simulated delay") for note in rank["energy"]["notes"])
    assert record["ranks"][0]["energy"]["devices"][0]["name"] != record["ranks"][1]["energy"]["devices"][0]["name"]
    sets = _sets(made.directory)
    assert {gpu for _, gpu, _ in sets} == {0, 1}  # each rank tuned its own GPU
    for gpu in (0, 1):
        mine = [mw for _, g, mw in sets if g == gpu]
        assert len(mine) >= 3 and all(100_000 <= mw <= A40_DEFAULT_MW for mw in mine)  # within the constraints
        assert len({pid for pid, g, _ in sets if g == gpu}) == 1
        assert mine[-1] == A40_DEFAULT_MW  # restored at the end, to the default, not to a tuned limit
    assert _limits_mw(made.directory) == [A40_DEFAULT_MW, A40_DEFAULT_MW]
    assert not (tmp_path / "state" / "knobs-journal.json").exists()  # nothing left to restore


def test_a_gpu_lost_mid_run_leaves_training_going_and_the_record_says_so(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="A40", count=2)
    inject(made.directory, 1, lose_after_reads=12)  # a few windows in: rank 1's GPU falls off the bus
    run_dir = tmp_path / "run"
    done = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--steps", "200", "--run-dir", str(run_dir),
                                   "--no-report", "--no-trace"),
                          env=_env(tmp_path, made.directory), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "record.json").read_text())
    assert record["status"] == "completed"
    lost = record["ranks"][1]["energy"]["lost"]
    assert list(lost) == ["gpu1 (NVIDIA A40)"] and "GPU is lost" in lost["gpu1 (NVIDIA A40)"]
    assert record["ranks"][0]["energy"]["lost"] == {}
    notes = record["ranks"][0]["energy"]["notes"]  # made without slow steps: no delay claimed
    assert not any("simulated delay" in note for note in notes) and "simulated delay" not in done.stderr


def test_monitor_shows_virtual_gpus_as_simulated(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="H100", count=1)
    out = tmp_path / "power.csv"
    done = subprocess.run(dtpo_cli("monitor", "--interval", "0.2", "--duration", "1", "--csv", str(out),
                                   "--cpu-tdp", "30"),
                          env=_env(tmp_path, made.directory), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [r for r in csv.DictReader(out.open()) if r["device"].startswith("gpu0")]
    assert len(rows) >= 3 and all(r["estimated"] == "True" for r in rows)
    energies = [float(r["energy_j"]) for r in rows]
    assert energies == sorted(energies) and energies[-1] > 0
    assert "H100" in rows[0]["device"]


def test_restore_after_kill_9_puts_the_limits_back_and_live_metrics_showed_them(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="A40", count=2, root=True, log_calls=True)
    port = free_port()
    env = _env(tmp_path, made.directory)
    run = subprocess.Popen(dtpo_cli("train", "--workload", "mlp", "--steps", "100000", "--tune", "power-limit",
                                    "--run-dir", str(tmp_path / "run"), "--no-report", "--no-trace",
                                    "--metrics-addr", f"127.0.0.1:{port}"),
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    page = ""
    try:
        deadline = time.monotonic() + 240  # a guard against a hang: waits for events, not for a time
        while not [s for s in _sets(made.directory) if s[2] != A40_DEFAULT_MW] if made.call_log.exists() else True:
            assert run.poll() is None and time.monotonic() < deadline, "the run never changed a limit"
            time.sleep(0.2)
        while "DCGM_FI_DEV_POWER_MGMT_LIMIT" not in page:
            assert run.poll() is None and time.monotonic() < deadline, "no GPU figures in the live metrics"
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                time.sleep(0.2)
    finally:  # kill -9 the workers (torchrun starts each in a session of its own), then the launcher
        for pid in {pid for pid, _, _ in _sets(made.directory)}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    assert 'modelName="NVIDIA A40"' in page and "DCGM_FI_DEV_POWER_USAGE" in page
    assert any(mw != A40_DEFAULT_MW for mw in _limits_mw(made.directory))  # left changed by the killed run
    journal = json.loads((tmp_path / "state" / "knobs-journal.json").read_text())
    assert journal["entries"]
    done = subprocess.run(dtpo_cli("restore"), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert _limits_mw(made.directory) == [A40_DEFAULT_MW, A40_DEFAULT_MW]
    assert done.stdout.count("restored") == len(journal["entries"]) and "power limit 300 W" in done.stdout
    assert not (tmp_path / "state" / "knobs-journal.json").exists()


def test_the_command_makes_shows_and_faults_them(tmp_path: Path) -> None:
    directory = tmp_path / "vgpu"
    made = subprocess.run(dtpo_cli("virtual-gpus", "create", str(directory), "--gpu", "V100", "--count", "2"),
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert f"export DTPO_VIRTUAL_GPUS={directory}" in made.stdout and "simulated" in made.stdout
    shown = subprocess.run(dtpo_cli("virtual-gpus", "show", str(directory)), capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("Tesla V100-PCIE-32GB") == 2 and "250 W" in shown.stdout and "mJ" in shown.stdout
    faulted = subprocess.run(dtpo_cli("virtual-gpus", "fault", str(directory), "--gpu", "1", "--lost"),
                             capture_output=True, text=True, timeout=60)
    assert faulted.returncode == 0, faulted.stderr
    shown = subprocess.run(dtpo_cli("virtual-gpus", "show", str(directory)), capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr  # one lost GPU does not hide the others
    assert shown.stdout.count("Tesla V100-PCIE-32GB") == 2 and "lost (GPU_IS_LOST)" in shown.stdout
    for args, says in ((["create", str(tmp_path / "x"), "--gpu", "MI250X"], "AMD GPU"),
                       (["create", str(tmp_path / "x"), "--count", "0"], "count must be 1-16"),
                       (["show", str(tmp_path / "nowhere")], "no virtual GPUs in"),
                       (["fault", str(directory)], "name a fault")):
        bad = subprocess.run(dtpo_cli("virtual-gpus", *args), capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def _slow_factors(directory: Path) -> list[float]:
    with st.locked(directory / st.STATE_FILE) as state:
        return [state.gpus[i].slow_factor for i in range(state.count)]


def test_fault_slow_makes_a_straggler_that_show_notes(tmp_path: Path, state: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    directory = create(tmp_path / "vgpu", gpu="A40", count=2, slow_steps=True).directory
    code, out, err = run_cli(["virtual-gpus", "fault", str(directory), "--gpu", "1", "--slow", "1.5"], capsys)
    assert code == 0 and "fault set" in out, err
    assert _slow_factors(directory) == [1.0, 1.5]
    shown = subprocess.run(dtpo_cli("virtual-gpus", "show", str(directory)), capture_output=True, text=True,
                           timeout=60, env={**os.environ, "DTPO_STATE_DIR": str(state)})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("slow x1.50") == 1 and shown.stdout.count("NVIDIA A40") == 2
    assert run_cli(["virtual-gpus", "fault", str(directory), "--gpu", "1", "--slow", "1"], capsys)[0] == 0
    assert _slow_factors(directory) == [1.0, 1.0]  # --slow 1 clears it
    for value in ("0.5", "nan", "inf", "-1"):
        code, _, err = run_cli(["virtual-gpus", "fault", str(directory), "--slow", value], capsys)
        assert code == 2 and "--slow must be a finite factor of 1 or more" in err, err
        assert len(err.strip().splitlines()) == 1, err
    plain = create(tmp_path / "plain", gpu="A40", count=1).directory  # made without --slow-steps
    code, _, err = run_cli(["virtual-gpus", "fault", str(plain), "--slow", "2"], capsys)
    assert code == 2 and "--slow needs virtual GPUs made with --slow-steps; " in err, err
    assert len(err.strip().splitlines()) == 1 and _slow_factors(plain) == [1.0]


def test_a_journal_planted_in_a_shared_state_folder_sets_nothing(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="A40", count=1, root=True)
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)  # like a /var/tmp/dtpo another user created first
    with st.locked(made.state_path) as gpus:
        uuid = gpus.gpus[0].uuid.decode()
    (state / "knobs-journal.json").write_text(json.dumps({"schema": "dtpo.knobs-journal/1", "entries": {
        f"nvml:{uuid}": {"device": "gpu0", "original": {"power_limit_w": 100.0, "locked_sm_clocks_mhz": None}}}}))
    env = _env(tmp_path, made.directory)
    done = subprocess.run(dtpo_cli("restore"), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"refusing the knob journal {state}/knobs-journal.json: {state} is writable by others" in done.stderr
    assert _limits_mw(made.directory) == [A40_DEFAULT_MW]  # the planted 100 W was not applied


def test_restore_exits_1_when_a_gpu_stays_changed(tmp_path: Path) -> None:
    made = create(tmp_path / "vgpu", gpu="A40", count=1, root=True)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    journal = state / "knobs-journal.json"
    journal.write_text(json.dumps({"schema": "dtpo.knobs-journal/1", "entries": {  # a GPU no longer in the node
        "nvml:GPU-00000000-dead-beef-0000-000000000000": {
            "device": "gpu3 (NVIDIA A40)", "original": {"power_limit_w": 300.0, "locked_sm_clocks_mhz": None}}}}))
    done = subprocess.run(dtpo_cli("restore"), env=_env(tmp_path, made.directory), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1, (done.stdout, done.stderr)  # a boot hook can tell that something stays changed
    assert "could not restore gpu3 (NVIDIA A40): no GPU with UUID" in done.stdout
    assert done.stderr.strip() == f"1 device(s) stay changed; they stay in {journal} for the next `dtpo restore`"
    assert json.loads(journal.read_text())["entries"]  # kept for a later try
