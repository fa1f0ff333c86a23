"""The simulated GPU: knobs change time and power as the model says, a lagging counter, noise, a straggler,
knob state in a file that survives SIGKILL and is restored by the next dtpo start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import dtpo_cli

from dtpo.core.errors import ConfigError
from dtpo.devices.base import DeviceError, KnobError, KnobState
from dtpo.devices.journal import KnobJournal, restore_pending
from dtpo.devices.knobs import KnobController
from dtpo.devices.physics.gpu_model import CalibratedModel
from dtpo.devices.simulated import (
    LEGACY_STATE_SCHEMA,
    SimulatedGpu,
    SimulatedGpuConfig,
    SimulatedGpuGroup,
    model_for,
    reopen_simulated,
)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def gpu(tmp_path: Path, name: str = "gpu0.json", **kwargs: object) -> SimulatedGpu:
    return SimulatedGpu(SimulatedGpuConfig("A40", "resnet50", **kwargs), tmp_path / name)  # type: ignore[arg-type]


def test_it_starts_at_the_default_limit_and_is_labelled_simulated(tmp_path: Path) -> None:
    device = gpu(tmp_path)
    assert device.knob_state() == KnobState(300.0, None)
    assert device.info.source == "simulated" and device.info.estimated
    assert device.knob_key == f"sim:{tmp_path / 'gpu0.json'}"
    assert not (tmp_path / "gpu0.json").exists()  # a file only while the settings differ from the defaults


def test_the_file_comes_and_goes_with_changed_settings(tmp_path: Path) -> None:
    device = gpu(tmp_path)
    device.set_power_limit(200)
    assert reopen_simulated(tmp_path / "gpu0.json").knob_state() == KnobState(200.0, None)
    device.set_power_limit(300)
    assert not (tmp_path / "gpu0.json").exists() and device.knob_state() == KnobState(300.0, None)


def test_a_group_shares_one_file_and_one_setting(tmp_path: Path) -> None:
    group = SimulatedGpuGroup(SimulatedGpuConfig("A40", "resnet50", time_noise=0, power_noise=0), 8,
                              tmp_path / "job.json", slowdowns={5: 1.5})
    assert [m.info.name.split()[0] for m in group.members] == [f"sim{i}" for i in range(8)]
    assert group.info.name.startswith("sim0-7 (8 x A40") and group.members[5].config.slowdown == 1.5
    assert {m.knob_key for m in group.members} == {group.knob_key}
    group.set_power_limit(150)
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]
    assert {m.operating_point().power_limit_w for m in group.members} == {150.0}
    reopened = reopen_simulated(tmp_path / "job.json")
    assert isinstance(reopened, SimulatedGpuGroup) and len(reopened.members) == 8
    assert reopened.members[5].config.slowdown == 1.5 and reopened.knob_state() == KnobState(150.0, None)
    for member in group.members:
        member.advance(np.array([1.0]), np.array([100.0]))
    assert group.energy_j() == pytest.approx(800.0, rel=0.2)  # the counters lag by at most a period


def test_a_state_file_of_the_per_gpu_layout_is_still_restored(tmp_path: Path) -> None:
    legacy = tmp_path / "sim" / "123" / "gpu3.json"
    legacy.parent.mkdir(parents=True)
    config = {"gpu": "A40", "workload": "resnet50", "index": 3}
    legacy.write_text(json.dumps({"schema": LEGACY_STATE_SCHEMA, "config": config, "power_limit_w": 120.0,
                                  "locked_sm_clocks_mhz": None}))
    journal = KnobJournal(tmp_path / "journal.json")
    journal._write({f"sim:{legacy}": {"device": "sim3", "original": {"power_limit_w": 300.0,
                                                                     "locked_sm_clocks_mhz": None}, "pid": 1}})
    assert restore_pending(journal)[0].startswith("restored sim3")
    assert not legacy.exists() and not journal.path.exists()


def test_a_lower_power_limit_slows_steps_and_lowers_power(tmp_path: Path) -> None:
    device = gpu(tmp_path, time_noise=0.0, power_noise=0.0)
    full = device.operating_point()
    device.set_power_limit(150)
    capped = device.operating_point()
    assert capped.time_per_sample_s > full.time_per_sample_s
    assert capped.power_w < full.power_w <= 300 + 1e-9
    times, powers = device.sample_steps(4)
    assert np.allclose(times, capped.time_per_sample_s * device.model.batch_size)
    assert np.allclose(powers, capped.power_w)


def test_a_locked_clock_is_kept_in_the_state_file(tmp_path: Path) -> None:
    device = gpu(tmp_path)
    clock = device.model.spec.sm_clocks_mhz[len(device.model.spec.sm_clocks_mhz) // 2]
    device.lock_sm_clocks(clock, clock)
    assert reopen_simulated(tmp_path / "gpu0.json").knob_state() == KnobState(300.0, (clock, clock))
    assert device.operating_point().sm_clock_mhz <= clock
    device.unlock_sm_clocks()
    assert device.knob_state().locked_sm_clocks_mhz is None


def test_the_energy_counter_updates_only_every_period(tmp_path: Path) -> None:
    device = gpu(tmp_path, counter_period_s=0.1)
    power = np.array([200.0])
    device.advance(np.array([0.05]), power)  # still before the first update
    assert device.energy_j() == 0.0
    device.advance(np.array([0.1]), power)  # now at 0.15 s: the counter shows 0.1 s worth
    assert device.energy_j() == pytest.approx(20.0)
    assert device.now_s == pytest.approx(0.15)


def test_waiting_costs_idle_power(tmp_path: Path) -> None:
    device = gpu(tmp_path, counter_period_s=0.0)
    idle = device.operating_point().idle_power_w
    joules = device.advance(np.array([1.0]), np.array([250.0]), np.array([0.5]))
    assert joules == pytest.approx(250.0 + 0.5 * idle) and device.energy_j() == pytest.approx(joules)


def test_noise_is_seeded_and_a_straggler_is_slower(tmp_path: Path) -> None:
    a = gpu(tmp_path, "a.json", seed=7).sample_steps(100)[0]
    b = gpu(tmp_path, "b.json", seed=7).sample_steps(100)[0]
    c = gpu(tmp_path, "c.json", seed=8).sample_steps(100)[0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert a.std() / a.mean() == pytest.approx(0.01, rel=0.3)
    slow = gpu(tmp_path, "slow.json", seed=7, slowdown=1.5).sample_steps(100)[0]
    assert np.allclose(slow, 1.5 * a)


def test_out_of_range_values_change_nothing(tmp_path: Path) -> None:
    device = gpu(tmp_path)
    with pytest.raises(KnobError, match="outside"):
        device.set_power_limit(500)
    with pytest.raises(KnobError, match="not supported"):
        device.lock_sm_clocks(7, 7)
    journal = KnobJournal()
    with KnobController("apply", journal, log=lambda _: None) as knobs:
        with pytest.raises(ConfigError, match="outside the range"):
            knobs.set_power_limit(device, 50)
        with pytest.raises(ConfigError, match="not supported"):
            knobs.lock_sm_clock(device, 7)
    assert device.knob_state() == KnobState(300.0, None) and not journal.path.exists()


def test_bad_configs_and_state_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="slowdown"):
        gpu(tmp_path, slowdown=0.0)
    with pytest.raises(ConfigError):
        SimulatedGpu(SimulatedGpuConfig("B200-imaginary", "resnet50"), tmp_path / "x.json")
    (tmp_path / "bad.json").write_text("{half")
    with pytest.raises(DeviceError, match="unreadable or corrupt"):
        reopen_simulated(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"schema": "something/1"}')
    with pytest.raises(DeviceError, match="not a simulated GPU state file"):
        reopen_simulated(tmp_path / "other.json")
    gone = reopen_simulated(tmp_path / "missing.json")  # no file: the defaults, nothing to put back
    gone.set_power_limit(300)
    gone.unlock_sm_clocks()
    assert not (tmp_path / "missing.json").exists()
    with pytest.raises(DeviceError, match="is gone"):
        gone.knob_state()


CHANGE_AND_HANG = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dtpo.devices.knobs import KnobController
    from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
    device = SimulatedGpu(SimulatedGpuConfig("A40", "resnet50"), Path(sys.argv[1]))
    knobs = KnobController("apply", log=lambda _: None).__enter__()
    knobs.set_power_limit(device, 150)
    knobs.lock_sm_clock(device, int(sys.argv[2]))
    print("changed", flush=True)
    time.sleep(120)
""")


def _changed_process(state_file: Path, clock: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", CHANGE_AND_HANG, str(state_file), str(clock)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout is not None and proc.stdout.readline().strip() == "changed"
    return proc


@pytest.mark.slow
def test_sigkill_leaves_a_journal_and_the_next_dtpo_start_restores(tmp_path: Path) -> None:
    state_file = tmp_path / "gpu0.json"
    clock = gpu(tmp_path).model.spec.sm_clocks_mhz[0]
    proc = _changed_process(state_file, clock)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert reopen_simulated(state_file).knob_state() == KnobState(150.0, (clock, clock))
    assert f"sim:{state_file}" in KnobJournal().entries()
    started = subprocess.run(dtpo_cli("simulate", "--list"), capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    assert "restored sim0" in started.stderr and "power limit 300 W" in started.stderr
    assert not state_file.exists()  # back at the defaults: the file has gone
    assert gpu(tmp_path).knob_state() == KnobState(300.0, None)
    assert not KnobJournal().path.exists()


@pytest.mark.slow
def test_sigterm_restores_before_the_process_ends(tmp_path: Path) -> None:
    state_file = tmp_path / "gpu0.json"
    proc = _changed_process(state_file, gpu(tmp_path).model.spec.sm_clocks_mhz[0])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not state_file.exists()  # back at the defaults: the file has gone
    assert gpu(tmp_path).knob_state() == KnobState(300.0, None)
    assert not KnobJournal().path.exists()


def write_sweep(path: Path, batches: tuple[int, ...] = (64,)) -> Path:
    """A user's measured H100 sweep (200-700 W) in the Zeus columns, one trace per batch size."""
    lines = ["network,dataset,batch_size,optimizer,power_limit,time_per_epoch,average_power,samples_per_epoch"]
    for batch in batches:
        for limit in range(200, 701, 100):
            lines.append(f"llama,mydata,{batch},adamw,{limit},{40 + 20000 / limit:.3f},{0.8 * limit:.1f},10000")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_gpu_group_on_a_trace_file_is_reopened_from_its_state_file(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_sweep(tmp_path / "sweep.csv")
    config = SimulatedGpuConfig("H100-SXM", "", trace_file="sweep.csv", time_noise=0, power_noise=0)
    group = SimulatedGpuGroup(config, 4, tmp_path / "job.json", slowdowns={2: 1.3})
    assert isinstance(group.model, CalibratedModel) and group.model.spec.name == "H100-SXM"
    assert group.model.workload == "llama/mydata" and group.model.batch_size == 64
    group.set_power_limit(300)
    stored = json.loads((tmp_path / "job.json").read_text())["config"]
    assert stored["trace_file"] == str(tmp_path / "sweep.csv")  # absolute: a restore may run elsewhere
    monkeypatch.chdir("/")
    reopened = reopen_simulated(tmp_path / "job.json")
    assert isinstance(reopened, SimulatedGpuGroup) and len(reopened.members) == 4
    assert reopened.members[2].config.slowdown == 1.3 and reopened.knob_state() == KnobState(300.0, None)
    assert reopened.members[0].operating_point() == group.members[0].operating_point()
    point = reopened.members[0].operating_point()
    assert point.time_per_sample_s * 10_000 == pytest.approx(float(f"{40 + 20000 / 300:.3f}"))
    assert point.power_w == 240.0
    reopened.set_power_limit(700)
    assert not (tmp_path / "job.json").exists()


def test_a_gone_trace_file_still_lets_the_journal_restore(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep.csv")
    state_file = tmp_path / "gpu0.json"
    device = SimulatedGpu(SimulatedGpuConfig("H100-SXM", "llama", trace_file=str(sweep)), state_file)
    journal = KnobJournal(tmp_path / "journal.json")
    knobs = KnobController("apply", journal, log=lambda _: None).__enter__()
    knobs.set_power_limit(device, 250)  # then the process "dies": no __exit__
    clock = device.model.spec.sm_clocks_mhz[10]
    knobs.lock_sm_clock(device, clock)
    sweep.unlink()
    reopened = reopen_simulated(state_file)
    assert reopened.knob_state() == KnobState(250.0, (clock, clock)) and "knobs only" in reopened.info.name
    assert reopened.energy_j() == 0.0
    lines = restore_pending(journal)
    assert lines[0].startswith("restored sim0") and "power limit 700 W" in lines[0]
    assert not state_file.exists() and not journal.path.exists()


def test_model_for_picks_the_trace_and_names_the_choices(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "two.csv", batches=(32, 64))
    with pytest.raises(ConfigError, match="2 traces that match.*llama/mydata/adamw batch 32; llama/mydata/adamw "
                                          "batch 64"):
        model_for(SimulatedGpuConfig("H100-SXM", "", trace_file=str(sweep)))
    assert model_for(SimulatedGpuConfig("H100-SXM", "llama", 32, trace_file=str(sweep))).batch_size == 32
    with pytest.raises(ConfigError, match="measured batch sizes: 32, 64"):
        model_for(SimulatedGpuConfig("H100-SXM", "llama", 48, trace_file=str(sweep)))
    with pytest.raises(ConfigError, match="parametric model cannot use one"):
        model_for(SimulatedGpuConfig("H100-SXM", "llama", 32, calibrated=False, trace_file=str(sweep)))
    with pytest.raises(ConfigError, match=r"two\.csv row 4, column power_limit: 400 W is outside the A40's"):
        SimulatedGpu(SimulatedGpuConfig("A40", "llama", 32, trace_file=str(sweep)), tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()
