"""``benchmarks/gpu_check.py`` (``make gpu-check``) without a GPU: its table and verdicts, the energy counter
against polled power, what it demands of run records, the "no GPU here" path, and that it cannot change a GPU."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fakes import FakeNvml, FakeNvmlGpu

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    """``gpu_check``, imported with ``benchmarks/`` on the path only while importing (its modules' names, such
    as ``frameworks``, must not shadow the tests' packages)."""
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("gpu_check")
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="module")
def parts(gc: ModuleType) -> ModuleType:
    return sys.modules["gpu_check_parts"]


@pytest.fixture(scope="module")
def judges(gc: ModuleType) -> ModuleType:
    return sys.modules["gpu_check_judges"]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeNvmlGpu(UUID)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return fake


class FakeTime:
    """A clock that moves only when slept on (and a little at each reading, as real reads take time)."""

    def __init__(self, step_s: float = 0.001) -> None:
        self.now = 100.0
        self.step_s = step_s

    def clock(self) -> float:
        self.now += self.step_s
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# -- check 1: counter against polled power ------------------------------------------------------------------------


def test_trapezoids_integrate_exactly_what_they_can(judges: ModuleType) -> None:
    assert judges.trapezoid([(0.0, 300.0), (1.0, 300.0), (3.0, 300.0)]) == pytest.approx(900.0)
    assert judges.trapezoid([(0.0, 100.0), (2.0, 300.0)]) == pytest.approx(400.0)  # a ramp: its mean times 2 s
    assert judges.trapezoid([(0.0, 300.0)]) == 0.0


def test_agreement_compares_mean_powers_and_fails_beyond_two_percent(judges: ModuleType) -> None:
    samples = [(float(t), 500.0) for t in range(11)]  # 10 s at 500 W
    close = judges.agreement(5050.0 * 1.01, 10.1, samples)  # a slightly longer window, 1 % more power
    assert close.mean_w == pytest.approx(505.0) and close.polled_w == pytest.approx(500.0)
    assert close.difference == pytest.approx(0.01) and close.verdict() == "pass"
    far = judges.agreement(5150.0, 10.0, samples)
    assert far.difference == pytest.approx(0.03) and far.verdict() == "fail"
    below = judges.agreement(4850.0, 10.0, samples)
    assert below.difference == pytest.approx(-0.03) and below.verdict() == "fail"
    assert judges.agreement(5000.0, 10.0, samples[:1]).verdict() == "fail"  # one poll integrates nothing


def _window(judges: ModuleType, counter_w: float, power_w: float = 300.0) -> Any:
    """A window over a fake clock: power polled at ``power_w``, a counter accumulating ``counter_w``."""
    fake = FakeTime()
    return judges.measure_window(lambda: power_w, 15.0, read_counter_mj=lambda: int(fake.now * counter_w * 1000),
                                read_other_j=lambda: fake.now * counter_w, clock=fake.clock, sleep=fake.sleep)


def test_a_window_polls_at_ten_hertz_and_agrees_when_the_counter_does(judges: ModuleType) -> None:
    window = _window(judges, counter_w=300.0)
    assert 150 <= len(window.samples) <= 152
    assert window.samples[-1][0] - window.samples[0][0] == pytest.approx(15.0, abs=0.2)
    raw, ours = window.counter(), window.other()
    assert abs(raw.difference) < 1e-3 and raw.verdict() == "pass"
    assert abs(ours.difference) < 1e-3 and ours.verdict() == "pass"


def test_a_counter_three_percent_high_fails(judges: ModuleType) -> None:
    window = _window(judges, counter_w=309.0)
    assert window.counter().difference == pytest.approx(0.03, abs=1e-3)
    assert window.counter().verdict() == "fail" and window.other().verdict() == "fail"


def test_a_window_without_counter_or_other_reader(judges: ModuleType) -> None:
    fake = FakeTime()
    window = judges.measure_window(lambda: 70.0, 2.0, clock=fake.clock, sleep=fake.sleep)
    assert window.counter() is None and window.other() is None and len(window.samples) >= 20


# -- MFU --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mfu", "gpu", "verdict"), [
    (0.45, "NVIDIA H100 80GB HBM3", "pass"),
    (0.40, "NVIDIA H200", "pass"),
    (0.39, "NVIDIA H100 PCIe", "fail"),
    (1.02, "NVIDIA H100 80GB HBM3", "fail"),
    (0.30, "NVIDIA A100-SXM4-80GB", "report"),  # no goal on an A100: reported only
    (1.01, "NVIDIA A100-SXM4-80GB", "fail"),  # but never above 100 %
    (0.20, "Some Unknown GPU", "report"),
    (None, "NVIDIA H100 80GB HBM3", "fail"),
])
def test_the_mfu_goal_holds_on_h100_and_h200_and_100_percent_everywhere(judges: ModuleType, mfu: float | None,
                                                                       gpu: str, verdict: str) -> None:
    goal, got = judges.mfu_verdict(mfu, gpu)
    assert got == verdict
    assert ("40%" in goal) == gpu.startswith(("NVIDIA H100", "NVIDIA H200"))


def test_an_mfu_dtpo_withheld_for_being_above_100_percent_counts_as_above(judges: ModuleType) -> None:
    note = ("rank 0 came out at 243% of its peak (NVIDIA H100 SXM bfloat16 dense peak), which cannot be true: the "
            "peak does not describe the kernels the step ran")
    record = {"totals": {"mfu": {"value": None, "unit": "fraction", "note": note}}}
    assert judges.mfu_of(record) == (pytest.approx(2.43), note)
    assert "243%" in judges.mfu_problem(record)
    assert judges.mfu_problem({"totals": {"mfu": {"value": 0.5}}}) is None
    assert judges.mfu_of({"totals": {"mfu": {"value": None, "note": "FLOPs or peak unknown"}}})[0] is None


# -- records -------------------------------------------------------------------------------------------------


def _step(i: int, step_s: float = 0.010, **parts_s: float | None) -> dict[str, Any]:
    base: dict[str, Any] = {"step": i, "warmup": i < 2, "samples": 16, "step_s": step_s, "data_wait_s": 0.0002,
                            "compute_s": 0.0088, "tail_s": 0.0, "optimizer_s": 0.001, "comm_exposed_s": 0.0,
                            "sync_wait_s": 0.0}
    return {**base, **parts_s}


def _record(steps: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    gpu = {"name": "gpu0 (NVIDIA H100 80GB HBM3)", "kind": "gpu", "source": "nvml-counter"}
    cpu = {"name": "cpu (modelled)", "kind": "cpu", "source": "modelled"}
    windows = [{"first_step": 2, "last_step": 6, "time_s": 0.05,
                "energy_j": {gpu["name"]: 30.0, cpu["name"]: 5.0}},
               {"first_step": 7, "last_step": 9, "time_s": 0.03,
                "energy_j": {gpu["name"]: 18.0, cpu["name"]: 3.0}}]
    rank = {"rank": 0, "device": "cuda:0", "steps": steps if steps is not None else [_step(i) for i in range(10)],
            "energy": {"devices": [gpu, cpu], "windows": windows},
            "tuning": {"source": "model", "mode": "dry-run", "applied": False,
                       "model": {"choice": {"power_limit_w": 550.0, "sm_clock_mhz": None},
                                 "model": "parametric H100-SXM, activity 0.80"}}}
    record = {"status": "completed", "environment": {"backend": "nccl", "device": "cuda:0"}, "ranks": [rank],
              "totals": {"mfu": {"value": 0.02}, "throughput": {"value": 1600.0}}}
    record.update(extra)
    return record


def test_gpu_energy_per_sample_counts_gpus_only_over_the_windows(judges: ModuleType) -> None:
    per_sample, samples, seconds = judges.gpu_energy_per_sample(_record())
    assert samples == 8 * 16 and seconds == pytest.approx(0.08)
    assert per_sample == pytest.approx(48.0 / 128)  # the modelled CPU's 8 J left out
    no_gpu = _record()
    no_gpu["ranks"][0]["energy"]["devices"] = no_gpu["ranks"][0]["energy"]["devices"][1:]
    assert judges.gpu_energy_per_sample(no_gpu) is None


def test_a_dry_run_tuning_record_with_a_model_choice_passes(judges: ModuleType) -> None:
    result, figure, verdict = judges.judge_tuning(_record())
    assert verdict == "pass", result
    assert "550 W" in figure and "model figure" in figure and "nvml-counter" in result


@pytest.mark.parametrize(("change", "why"), [
    ({"source": "measured"}, "tuning source 'measured'"),
    ({"mode": "apply"}, "knob mode 'apply'"),
    ({"applied": True}, "applied"),
    ({"model": {"choice": None, "note": "no power model of gpu0"}}, "no model choice: no power model"),
])
def test_a_tuning_record_without_a_dry_run_model_figure_fails(judges: ModuleType, change: dict[str, Any],
                                                              why: str) -> None:
    record = _record()
    record["ranks"][0]["tuning"].update(change)
    result, _, verdict = judges.judge_tuning(record)
    assert verdict == "fail" and why in result


def test_a_tuning_record_whose_gpu_energy_is_not_from_nvml_fails(judges: ModuleType) -> None:
    record = _record()
    record["ranks"][0]["energy"]["devices"][0]["source"] = "simulated"
    result, _, verdict = judges.judge_tuning(record)
    assert verdict == "fail" and "GPU energy source simulated" in result


def test_a_breakdown_whose_parts_sum_to_each_step_passes(judges: ModuleType) -> None:
    result, figure, verdict = judges.judge_breakdown(_record())
    assert verdict == "pass", result
    assert "8 steps on cuda:0 over nccl" in result and "largest gap" in figure


def test_a_breakdown_with_only_the_unsplit_tail_counts_the_tail(judges: ModuleType) -> None:
    steps = [_step(i, compute_s=0.0078, tail_s=0.001, comm_exposed_s=None, sync_wait_s=None) for i in range(10)]
    assert judges.judge_breakdown(_record(steps))[2] == "pass"


def test_a_step_whose_parts_miss_its_time_fails(judges: ModuleType) -> None:
    steps = [_step(i) for i in range(10)]
    steps[5] = _step(5, compute_s=0.0083)  # 0.5 ms of the 10 ms step unaccounted: 5 %
    result, figure, verdict = judges.judge_breakdown(_record(steps))
    assert verdict == "fail" and "1 of 8 steps" in result and "step 5" in figure


def test_a_breakdown_not_over_nccl_on_cuda_fails(judges: ModuleType) -> None:
    record = _record(environment={"backend": "gloo", "device": "cpu"})
    record["ranks"][0]["device"] = "cpu"
    result, _, verdict = judges.judge_breakdown(record)
    assert verdict == "fail" and "backend 'gloo', not nccl" in result and "not CUDA" in result


def test_every_record_is_held_to_100_percent_mfu(judges: ModuleType) -> None:
    record = _record(totals={"mfu": {"value": 1.3}})
    assert judges.judge_breakdown(record)[2] == "fail"
    assert judges.judge_tuning(record)[2] == "fail"


def test_the_monitor_must_show_a_gpu_with_power(judges: ModuleType) -> None:
    csv_text = ("t_s,device,source,estimated,power_w,energy_j\n"
                "1.0,gpu0 (NVIDIA H100 80GB HBM3),nvml-counter,False,71.0,71.0\n"
                "1.0,cpu (modelled),modelled,True,20.0,20.0\n"
                "2.0,gpu0 (NVIDIA H100 80GB HBM3),nvml-counter,False,73.0,143.0\n")
    shown = "t=    1.0 s  gpu0 (NVIDIA H100 80GB HBM3) 71.0 W  |  cpu (modelled) 20.0 W"
    result, figure, verdict = judges.judge_monitor(0, csv_text, shown)
    assert verdict == "pass" and "via nvml-counter: 2 readings" in result and figure == "72.0 W mean"
    cpu_only = "\n".join(line for line in csv_text.splitlines() if "gpu0" not in line)
    assert judges.judge_monitor(0, cpu_only, shown)[2] == "fail"
    assert judges.judge_monitor(2, csv_text, "dtpo: error: no power source")[2] == "fail"


# -- table, exit code, dependencies ------------------------------------------------------------------------------


def test_the_table_and_its_markdown(judges: ModuleType) -> None:
    rows = [judges.Row("1 nvml-energy (raw)", "counter a | b " + "long words " * 12, "+0.12%", "<= 2%", "pass"),
            judges.Row("6 mfu", "could not run: no CUDA", verdict="skip")]
    text = judges.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["check", "result", "figure", "goal", "verdict"]
    assert len(lines) > 4 and all(len(line) <= 170 for line in lines)  # the long result wrapped
    markdown = judges.markdown_table(rows)
    assert markdown.splitlines()[1] == "|---|---|---|---|---|"
    assert "counter a \\| b" in markdown and markdown.count("\n") == 4
    with pytest.raises(ValueError):
        judges.Row("x", "y", verdict="ok")


def test_only_a_failed_check_fails_the_run(judges: ModuleType) -> None:
    row = judges.Row
    assert judges.exit_code([row("0", "a", verdict="pass"), row("1", "b", verdict="skip"),
                            row("2", "c", verdict="warn"), row("3", "d", verdict="report")]) == 0
    assert judges.exit_code([row("0", "a", verdict="pass"), row("1", "b", verdict="fail")]) == 1


def test_requirements_and_versions(judges: ModuleType) -> None:
    assert judges.parse_requirement("typer>=0.29") == ("typer", [(">=", "0.29")])
    assert judges.parse_requirement("torch==2.13.0") == ("torch", [("==", "2.13.0")])
    assert judges.parse_requirement("ray[train]>=2.51") == ("ray", [(">=", "2.51")])
    assert judges.satisfies("0.29.2", [(">=", "0.29")]) and not judges.satisfies("0.28.1", [(">=", "0.29")])
    assert not judges.satisfies("2.11.0+cu130", [("==", "2.13.0")])
    assert judges.satisfies("2.13.0+cpu", [("==", "2.13.0")])
    versions = {"torch": "2.11.0+cu130", "numpy": "2.5.2", "typer": "0.30.0"}
    found, missing, other = judges.dependency_report(["torch==2.13.0", "numpy>=1.26", "typer>=0.29", "rich>=13"],
                                                    versions.get)
    assert missing == ["rich"] and found == ["torch 2.11.0+cu130", "numpy 2.5.2", "typer 0.30.0"]
    assert other == ["torch 2.11.0+cu130 (pyproject wants ==2.13.0)"]


def test_dtpo_runtime_requirements_come_from_pyproject(gc: ModuleType, judges: ModuleType) -> None:
    names = [judges.parse_requirement(r)[0] for r in gc.runtime_requirements()]
    assert {"torch", "numpy", "typer", "rich", "matplotlib", "prometheus-client", "nvidia-ml-py"} <= set(names)


@pytest.mark.parametrize(("probe", "requirements", "nvml_ok", "verdict", "says"), [
    ({"guarded": True}, ["pytest>=1"], True, "pass", "NVML setters refused in children"),
    ({"guarded": True}, ["pytest>=999"], True, "warn", "other versions: pytest"),
    ({"guarded": True}, ["surely-not-installed-dist>=1"], True, "fail", "missing: surely-not-installed-dist"),
    ({"guarded": True}, ["surely-not-installed-dist>=1"], False, "warn", "missing: surely-not-installed-dist"),
    ({"guarded": True, "cli_error": "ModuleNotFoundError: No module named 'pydantic'"}, ["pytest>=1"], True,
     "fail", "dtpo's CLI cannot be imported: ModuleNotFoundError: No module named 'pydantic'"),
    ({"guarded": False}, ["pytest>=1"], True, "fail", "the NVML guard is off in child processes"),
])
def test_the_environment_row(gc: ModuleType, tmp_path: Path, probe: dict[str, Any], requirements: list[str],
                             nvml_ok: bool, verdict: str, says: str) -> None:
    ctx = gc.Context(python=sys.executable, work=tmp_path, env={}, probe=dict(probe),
                     nvml_reason=None if nvml_ok else "no NVML here", cuda_reason="no CUDA here")
    row = gc.environment_row(ctx, requirements)
    assert row.verdict == verdict and says in row.result, row


# -- never changing the GPU ----------------------------------------------------------------------------------


def test_the_scripts_call_no_nvml_setter_and_build_read_only_controllers_only(gc: ModuleType) -> None:
    for name in ("gpu_check.py", "gpu_check_parts.py"):
        source = (BENCHMARKS / name).read_text()
        calls = re.findall(r"\bnvml\w*(?:Set|Reset|Clear|Create|Destroy|Modify)\w*\s*\(", source)
        assert calls == [], (name, calls)
        assert not re.search(r"\.(set_power_limit|lock_sm_clocks|unlock_sm_clocks)\(", source.replace(
            "controller.set_power_limit(", "")), name  # devices are never changed directly
        assert not re.search(r"nvidia-smi\s+-(pl|lgc|rgc|pm|c|r)\b", source), name
    source = (BENCHMARKS / "gpu_check.py").read_text()
    assert source.count("KnobController(") == 1  # in read_only_controller, behind its mode check
    assert not re.search(r"KnobController\([^)]*\"apply\"", source)


@pytest.mark.parametrize("mode", ["apply", "bogus"])
def test_a_controller_that_could_change_a_gpu_is_refused(gc: ModuleType, tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="dry-run or observe mode only"):
        gc.read_only_controller(mode, tmp_path / "journal.json", print)
    assert gc.read_only_controller("dry-run", tmp_path / "journal.json", print).mode == "dry-run"


def test_the_guard_refuses_every_setter_and_keeps_the_readers(parts: ModuleType, tmp_path: Path) -> None:
    pynvml = pytest.importorskip("pynvml")
    copy = types.ModuleType("pynvml_copy")
    copy.__dict__.update({k: v for k, v in vars(pynvml).items() if not k.startswith("__")})
    refused = set(parts.forbidden_names(copy))
    assert {"nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks",
            "nvmlDeviceSetApplicationsClocks", "nvmlDeviceSetPersistenceMode", "nvmlDeviceSetComputeMode",
            "nvmlDeviceSetMigMode", "nvmlDeviceSetPowerManagementLimit_v2"} <= refused
    readers = {"nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
               "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetTotalEnergyConsumption",
               "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMigMode", "nvmlDeviceGetPowerManagementLimitConstraints",
               "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetPowerManagementLimit",
               "nvmlDeviceGetSupportedMemoryClocks", "nvmlDeviceGetSupportedGraphicsClocks", "nvmlDeviceGetClockInfo",
               "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlSystemGetDriverVersion",
               "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetComputeMode", "nvmlDeviceGetApplicationsClock",
               "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetThermalSettings"}
    assert not readers & refused
    seen: list[str] = []
    log = tmp_path / "guard.log"
    replaced = parts.install_guard(copy, log, seen)
    assert set(replaced) == refused and parts.install_guard(copy, log, seen) == []  # idempotent
    with pytest.raises(parts.ForbiddenNvmlCall, match="nvmlDeviceSetPowerManagementLimit"):
        copy.nvmlDeviceSetPowerManagementLimit(None, 100_000)
    assert seen == ["nvmlDeviceSetPowerManagementLimit"]
    assert log.read_text().split()[1:] == ["nvmlDeviceSetPowerManagementLimit"]
    assert copy.nvmlDeviceGetPowerUsage is pynvml.nvmlDeviceGetPowerUsage  # readers untouched


def test_the_guard_sitecustomize_guards_the_process_it_runs_in(parts: ModuleType, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setitem(sys.modules, "_gpu_check_guard", None)  # the sitecustomize puts its module there
    monkeypatch.setenv(parts.GUARD_LOG_ENV, str(tmp_path / "guard.log"))
    site = tmp_path / "sitecustomize.py"
    text = parts.sitecustomize_text(BENCHMARKS / "gpu_check_parts.py")
    with monkeypatch.context() as narrow:  # no other sitecustomize to chain to, whatever this machine has
        narrow.setattr(importlib.machinery.PathFinder, "find_spec", classmethod(lambda *args, **kwargs: None))
        exec(compile(text, str(site), "exec"), {"__file__": str(site), "__name__": "sitecustomize"})
    with pytest.raises(RuntimeError, match="gpu_check refuses nvmlDeviceSetGpuLockedClocks"):
        fake.nvmlDeviceSetGpuLockedClocks(None, 1980, 1980)
    assert (tmp_path / "guard.log").read_text().split()[1:] == ["nvmlDeviceSetGpuLockedClocks"]
    assert fake.calls == []


def test_the_knob_check_reads_and_changes_nothing(gc: ModuleType, nvml: FakeNvml, tmp_path: Path) -> None:
    gc.install_guard(nvml, tmp_path / "guard.log")
    gpu = gc.open_dtpo_gpu()
    try:
        rows = gc.knob_rows(gpu, tmp_path / "journal.json")
    finally:
        gpu.close()
    assert [r.verdict for r in rows] == ["pass"], rows
    assert "100-300 W, default 300 W, now 300 W" == rows[0].figure
    assert "5 SM clocks 210-1740 MHz" in rows[0].result and "via nvml-counter" in rows[0].result
    assert all(call == ("get_limit",) for call in nvml.calls), nvml.calls  # no set, lock or unlock
    assert not (tmp_path / "journal.json").exists() and not (tmp_path / "guard.log").exists()


def test_a_controller_bug_that_would_apply_is_stopped_by_the_guard(gc: ModuleType, parts: ModuleType, nvml: FakeNvml,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.devices.knobs import KnobController

    monkeypatch.setattr(KnobController, "_change", lambda self, device, what, change: change() or True)
    seen: list[str] = []
    gc.install_guard(nvml, None, seen)
    gpu = gc.open_dtpo_gpu()
    try:
        with pytest.raises(parts.ForbiddenNvmlCall):
            gc.knob_rows(gpu, tmp_path / "journal.json")
    finally:
        gpu.close()
    assert seen == ["nvmlDeviceSetPowerManagementLimit"] and nvml.gpus[0].limit_mw == 300_000


def test_settings_are_compared_before_and_after(judges: ModuleType, nvml: FakeNvml) -> None:
    gpu = nvml.gpus[0]
    before = judges.read_settings(nvml, gpu)
    assert before["power limit mW"] == 300_000 and before["persistence mode"] is None  # the fake cannot tell
    gpu.limit_mw = 250_000
    assert judges.settings_changes(before, judges.read_settings(nvml, gpu)) == ["power limit mW: 300000 -> 250000"]
    assert judges.settings_changes(before, before) == []


# -- the whole script without CUDA ----------------------------------------------------------------------------


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in ("DTPO_STATE_DIR", "DTPO_CACHE_DIR", "DTPO_STORE"):  # main() points them at its work folder
        monkeypatch.setenv(key, str(tmp_path / "unused"))
    yield


def _no_cuda(gc: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def probe_cuda(ctx: Any) -> None:
        ctx.cuda_reason = "torch 2.13.0+cpu was built without CUDA"
        ctx.probe.update(torch="2.13.0+cpu", cuda=False)

    monkeypatch.setattr(gc, "probe_cuda", probe_cuda)


def test_no_gpu_here_lists_every_check_and_exits_0(gc: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], settings_env: None) -> None:
    def no_nvml(ctx: Any) -> None:
        ctx.nvml_reason = "NVML library (libnvidia-ml.so.1) not found"

    monkeypatch.setattr(gc, "probe_nvml", no_nvml)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))  # main() guards pynvml: never the real one here
    _no_cuda(gc, monkeypatch)
    out = tmp_path / "note.md"
    assert gc.main(["--out", str(out), "--work-dir", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    assert first.startswith("no GPU here: NVML: NVML library (libnvidia-ml.so.1) not found; CUDA: torch 2.13.0+cpu "
                            "was built without CUDA. Could not run: 1 nvml-energy, 2 monitor, 3 knobs")
    assert all(check.label in first for check in gc.CHECKS)
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 1 + len(gc.CHECKS) and rows[0].startswith("| 0 environment")
    assert all(row.endswith("| skip |") and "could not run: no " in row for row in rows[1:])


def test_with_nvml_and_no_cuda_the_nvml_checks_run_and_the_rest_say_why_not(
        gc: ModuleType, nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], settings_env: None) -> None:
    _no_cuda(gc, monkeypatch)
    work = tmp_path / "work"
    code = gc.main(["--only", "3,knobs,5,6,8", "--work-dir", str(work), "--out", str(tmp_path / "note.md")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.splitlines()[0] == ("could not run: 5 bf16-vs-fp32 (no CUDA: torch 2.13.0+cpu was built without "
                                       "CUDA); 6 mfu (no CUDA: torch 2.13.0+cpu was built without CUDA)")
    table = (tmp_path / "note.md").read_text()
    assert "| 3 knobs | gpu0 (NVIDIA H100 80GB HBM3) via nvml-counter" in table
    assert re.search(r"\| 8 untouched \| gpu0 \(NVIDIA H100 80GB HBM3\) via nvml-counter: power limit mW 300000 .*"
                     r"\| pass \|", table)
    assert all(call == ("get_limit",) for call in nvml.calls)
    assert not (work / "guard.log").exists()


def test_a_check_that_raises_is_one_failed_row_and_the_others_still_run(
        gc: ModuleType, nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], settings_env: None) -> None:
    _no_cuda(gc, monkeypatch)

    def broken(ctx: Any, limit: Any) -> list[Any]:
        raise RuntimeError("NVML went away\nsecond line")

    checks = tuple(c if c.name != "knobs" else gc.Check(c.number, c.name, c.needs, c.timeout_s, broken)
                   for c in gc.CHECKS)
    monkeypatch.setattr(gc, "CHECKS", checks)
    assert gc.main(["--only", "3,8", "--work-dir", str(tmp_path / "work")]) == 1
    printed = capsys.readouterr().out
    assert re.search(r"3 knobs\s+error: RuntimeError: NVML went away second line\s+fail", printed)
    assert re.search(r"8 untouched\s+.*pass", printed)


def test_a_spent_budget_skips_checks_but_never_the_last_look_at_the_settings(
        gc: ModuleType, nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], settings_env: None) -> None:
    _no_cuda(gc, monkeypatch)
    assert gc.main(["--only", "3,8", "--budget-s", "1", "--work-dir", str(tmp_path / "work")]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"3 knobs\s+could not run: the time budget \(--budget-s 1\) is spent\s+skip", printed)
    assert re.search(r"8 untouched\s+gpu0 .*pass", printed)


@pytest.mark.parametrize(("argv", "message"), [
    (["--load-s", "0"], "--load-s must be between 1 and 120 seconds"),
    (["--budget-s", "nan"], "--budget-s must be a positive number"),
    (["--only", "9"], "--only: unknown check 9"),
    (["--out", "/nonexistent-dir/x.md"], "--out /nonexistent-dir/x.md: not a file in an existing directory"),
    (["--gpt-width", "1000"], "--gpt-width must be a multiple of 128"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_flags_are_one_line_and_exit_2(gc: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str],
                                           message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        gc.parse_options(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_check.py: error: ") and message in err


def test_the_gpt_is_sized_by_memory(parts: ModuleType) -> None:
    assert parts.gpt_size(80.0) == {"width": 4096, "layers": 4, "heads": 32, "seq": 2048, "batch": 4}
    assert parts.gpt_size(24.0) == {"width": 2048, "layers": 4, "heads": 16, "seq": 2048, "batch": 2}
    assert parts.gpt_size(80.0, width=1024, layers=2, batch=1)["heads"] == 8


def test_a_session_run_is_made_once_and_shared(gc: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    made: list[list[str]] = []

    def run_child(cmd: list[str], env: dict[str, str], timeout_s: float, log: Path) -> Any:
        made.append(cmd)
        run_dir = Path(cmd[cmd.index("--run-dir") + 1])
        run_dir.mkdir(parents=True)
        (run_dir / "record.json").write_text(json.dumps(_record()))
        Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3",
                                                                  "attention_share": 0.2}))
        return gc.Child(0, "", "", 1.0, False)

    monkeypatch.setattr(gc, "run_child", run_child)
    ctx = gc.Context(python=sys.executable, work=tmp_path, env={})
    limit = gc.Limit(1e12)
    rows = gc.check_mfu(ctx, limit) + gc.check_precision(ctx, limit)
    assert [c[c.index("--precision") + 1] for c in made] == ["bf16-mixed", "32-true"]  # bf16 once, for both
    assert "--count-attention" in made[0] and "--count-attention" not in made[1]
    mfu, precision = rows
    assert mfu.verdict == "fail" and mfu.figure.startswith("2.0% (1.8% with causal attention at half)")
    assert precision.verdict == "fail" and precision.figure == "speed x1.00, energy x1.000"  # same records


@pytest.mark.slow
def test_on_virtual_gpus_the_nvml_checks_run_labelled_simulated_and_no_setter_reaches_nvml(tmp_path: Path) -> None:
    """The whole script in a process of its own on dtpo's NVML stand-in (setters allowed, as for root): the NVML
    checks pass, say ``simulated`` as dtpo does, and the stand-in's own log shows no setter call."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler to build the NVML stand-in")
    from dtpo.devices.virtual_nvml import ENV
    from dtpo.devices.virtual_nvml.make import create

    made = create(tmp_path / "vgpu", gpu="H100", count=1, root=True, log_calls=True)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env[ENV] = str(made.directory)
    out = tmp_path / "note.md"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--only", "1,2,3,8", "--load-s", "2",
                           "--out", str(out), "--work-dir", str(tmp_path / "work")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "NVML setters refused in children" in rows["0 environment"]
    for label in ("1 nvml-energy (raw)", "1 nvml-energy (dtpo)", "2 monitor", "3 knobs", "8 untouched"):
        assert rows[label].endswith("| pass |"), rows.get(label)
        assert "simulated" in rows[label], rows[label]
    calls = {line.split()[1] for line in made.call_log.read_text().splitlines() if len(line.split()) > 1}
    assert "nvmlDeviceGetPowerUsage" in calls and "nvmlDeviceGetPowerManagementLimitConstraints" in calls
    assert not [c for c in calls if re.search(r"Set|Reset|Clear", c)], calls
