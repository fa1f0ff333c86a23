"""``make gpu-check``: dtpo on a real NVIDIA GPU, checked in about eight minutes, without changing the GPU.

Every check is independent (a failure or a time-out in one leaves the others running) and ends in rows of one
table (check, result, figure, goal, verdict), printed at the end and written as markdown with ``--out FILE``:

0. ``environment``: the interpreter, torch and CUDA, the GPU and driver, dtpo's runtime dependencies against
   ``pyproject.toml`` and whether its CLI imports (a missing one fails, another version warns), and whether the
   guard of check 8 is on in child processes (off fails).
1. ``nvml-energy``: NVML's total-energy counter against power polled at 10 Hz (``nvmlDeviceGetPowerUsage``,
   integrated by trapezoids) over ``--load-s`` seconds of steady bf16 matrix products; goal: mean powers within
   2 %. The same through dtpo's own device (``open_nvml_gpus``, labelled with the source dtpo reports). Without
   CUDA (NVML alone) it compares them on the idle GPU.
2. ``monitor``: ``dtpo monitor`` runs a few seconds and shows the GPU with its power.
3. ``knobs``: power-limit range, default and current limit, supported SM clocks read through dtpo, and a
   ``KnobController`` in ``dry-run`` and ``observe`` mode only: it must change nothing.
4. ``tune-dry-run``: ``dtpo train --tune power-limit --dry-run``: the record holds the tuner's model figure
   (``source: model``) and the GPU's energy came from ``nvml-counter`` / ``nvml-polled``.
5. ``bf16-vs-fp32``: dtpo's own GPT (the ``lm`` workload's model, sized up) through ``dtpo.Session`` in
   ``bf16-mixed`` and ``32-true``: throughput and GPU energy per sample as ratios; goal: bf16 faster and cheaper.
6. ``mfu``: the MFU dtpo reports for that GPT in bf16 (FLOPs from ``torch.utils.flop_counter``, the catalogue's
   peak); goal at least 40 % on an H100 or H200 (reported only on other GPUs), and never above 100 % anywhere:
   every record read here is held to that.
7. ``nccl-breakdown``: ``dtpo train --workers 1 --backend nccl`` on the GPU: the record's per-rank breakdown
   (data wait, compute, communication, sync wait, optimizer) sums to each step's time within 1 % + 0.1 ms.
8. ``untouched``: power limit, persistence and compute mode and application clocks are as they were, and no
   process asked NVML for a change: every process this script starts carries a guard that refuses each pynvml
   setter (``gpu_check_parts.install_guard``, through a ``sitecustomize``).

The script never imports torch: what needs it runs in child processes (``gpu_check_parts.py``, and dtpo's CLI as
``python -m dtpo``) with the same interpreter, ``src`` on ``PYTHONPATH``, and a per-check time limit inside the
whole ``--budget-s``. Without an NVIDIA GPU it prints ``no GPU here: <reason>`` with every check it could not
run, and exits 0; where NVML works but CUDA does not, the NVML checks (1 without load, 2, 3, 8) still run.

    python benchmarks/gpu_check.py [--out note.md] [--only 1,6] [--budget-s 480] [--load-s 15] [--work-dir DIR]

Exit status: 0 when no check failed, 1 when one did, 2 for bad flags.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SRC = REPO / "src"
PARTS = HERE / "gpu_check_parts.py"  # also the script of the child processes
if importlib.util.find_spec("dtpo") is None:  # run without PYTHONPATH=src and without an installed dtpo
    sys.path.insert(0, str(SRC))
sys.path.insert(0, str(HERE))  # bench_cli and gpu_check_*, next to this file

from bench_cli import OneLineParser, bad_flag  # noqa: E402
from gpu_check_judges import (  # noqa: E402
    BREAKDOWN_SLACK_S,
    BREAKDOWN_TOLERANCE,
    COUNTER_TOLERANCE,
    Row,
    dependency_report,
    describe_size,
    exit_code,
    figure,
    format_table,
    gpu_energy_per_sample,
    judge_breakdown,
    judge_monitor,
    judge_tuning,
    last_line,
    markdown_table,
    measure_window,
    mfu_of,
    mfu_problem,
    mfu_verdict,
    no_gpu_line,
    one_line,
    read_settings,
    settings_changes,
)
from gpu_check_parts import (  # noqa: E402
    GUARD_LOG_ENV,
    install_guard,
    sitecustomize_text,
)

MIN_CHECK_S = 20.0  # a check is not started with less of the budget left
WARM_S = 3.0  # the load runs this long before the energy window opens
SETTINGS_ENV = {"DTPO_STATE_DIR": "state", "DTPO_CACHE_DIR": "cache", "DTPO_STORE": "store.sqlite"}

_t0 = time.monotonic()


def progress(message: str) -> None:
    """One progress line on stderr, with the seconds since the start."""
    sys.stderr.write(f"[gpu-check {time.monotonic() - _t0:6.1f} s] {message}\n")
    sys.stderr.flush()


# -- this machine's dtpo dependencies (check 0) --------------------------------------------------------------------


def runtime_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """dtpo's runtime requirements: ``[project] dependencies`` and the ``nvidia`` extra (pynvml)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project.get("dependencies", [])) + list(project.get("optional-dependencies", {}).get("nvidia", []))


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- check 3: knob controllers that cannot change anything ---------------------------------------------------------

READ_ONLY_MODES = ("dry-run", "observe")


def read_only_controller(mode: str, journal_path: Path, log: Callable[[str], None]) -> Any:
    """A :class:`~dtpo.devices.knobs.KnobController` in ``dry-run`` or ``observe`` mode, with its own journal.

    Raises:
        ValueError: Any other mode: this script never builds a controller that could change a GPU.
    """
    if mode not in READ_ONLY_MODES:
        raise ValueError(f"gpu_check builds knob controllers in {' or '.join(READ_ONLY_MODES)} mode only, not {mode!r}")
    from dtpo.devices.journal import KnobJournal
    from dtpo.devices.knobs import KnobController

    return KnobController(mode, journal=KnobJournal(journal_path), log=log)


def knob_rows(gpu: Any, journal_path: Path) -> list[Row]:
    """Check 3 on one open dtpo GPU: read its knobs, ask both read-only controllers to change them, and see that
    nothing changed, nothing was journaled, and each controller said it would not apply."""
    name = gpu.info.name
    limits = gpu.knob_limits()
    before = gpu.knob_state()
    sm_now = gpu.sm_clock_mhz()
    if limits is None:
        return [Row("3 knobs", f"{name} reports no knobs", verdict="fail")]
    clocks = limits.sm_clocks_mhz
    problems = []
    if not limits.min_power_limit_w <= limits.default_power_limit_w <= limits.max_power_limit_w:
        problems.append("default limit outside the range")
    if not limits.min_power_limit_w <= before.power_limit_w <= limits.max_power_limit_w:
        problems.append("current limit outside the range")
    said: list[str] = []
    changed = []
    for mode in READ_ONLY_MODES:
        controller = read_only_controller(mode, journal_path, said.append)
        changed.append(controller.set_power_limit(gpu, before.power_limit_w))  # a bug would change nothing
        if clocks:
            changed.append(controller.lock_sm_clock(gpu, clocks[-1]))
        controller.restore()
    after = gpu.knob_state()
    expected = (1 + bool(clocks)) * len(READ_ONLY_MODES)
    if any(changed):
        problems.append("a read-only controller reported a change")
    if after != before:
        problems.append(f"the knob state changed: {before} -> {after}")
    if journal_path.exists():
        problems.append(f"a journal was written ({journal_path})")
    if len(said) != expected or not all(s.startswith(("dry run: would set", "observe mode:")) for s in said):
        problems.append(f"the controllers said {said!r}")
    clock_text = (f"{len(clocks)} SM clocks {clocks[0]}-{clocks[-1]} MHz" if clocks else "no lockable SM clocks")
    fig = (f"{limits.min_power_limit_w:g}-{limits.max_power_limit_w:g} W, default "
           f"{limits.default_power_limit_w:g} W, now {before.power_limit_w:g} W")
    what = (f"{name} via {gpu.info.source}: {clock_text}" + (f", SM now {sm_now:g} MHz" if sm_now else "")
            + f"; dry-run and observe said {len(said)} times they would not apply")
    if problems:
        return [Row("3 knobs", "; ".join(problems) + f" ({what})", fig, "read only, nothing changed", "fail")]
    return [Row("3 knobs", what, fig, "read only, nothing changed", "pass")]


# -- running children ----------------------------------------------------------------------------------------------


@dataclass
class Child:
    """A finished child process."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    def why(self) -> str:
        """One line on how it ended badly."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s; {last_line(self.stderr or self.stdout)}"
        return f"exit {self.returncode}: {last_line(self.stderr or self.stdout)}"


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL, to the process group this script started for ``proc`` (torchrun's workers too)."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(cmd: Sequence[str], env: dict[str, str], timeout_s: float, log: Path) -> Child:
    """Run ``cmd`` in a process group of its own, kill the group at ``timeout_s``, keep its output in ``log``."""
    started = time.monotonic()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    child = Child(proc.returncode, out or "", err or "", time.monotonic() - started, timed_out)
    log.write_text(f"$ {' '.join(cmd)}\n# exit {child.returncode}, {child.seconds:.1f} s"
                   f"{', timed out' if timed_out else ''}\n--- stdout\n{child.stdout}\n--- stderr\n{child.stderr}")
    return child


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or ``None`` when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- the context every check gets ----------------------------------------------------------------------------------


@dataclass
class Limit:
    """The time a check may still take."""

    deadline: float

    def left(self) -> float:
        """Seconds left (never below 1)."""
        return max(self.deadline - time.monotonic(), 1.0)


@dataclass
class Context:
    """What the checks share: where they run, what this machine has, and the runs already made."""

    python: str
    work: Path
    env: dict[str, str]
    nvml_reason: str | None = None  # why NVML is unusable; None when it works
    cuda_reason: str | None = None
    gpu_name: str = ""
    gpu_index: int = 0
    gpu_label: str = ""  # "gpu0 (NVIDIA H100 80GB HBM3) via nvml-counter", the source as dtpo reports it
    virtual: bool = False  # dtpo's NVML stand-in (DTPO_VIRTUAL_GPUS): every NVML figure is simulated
    probe: dict[str, Any] = field(default_factory=dict)
    load_s: float = 15.0
    gpt: dict[str, int | None] = field(default_factory=dict)
    gpt_steps: int = 30
    gpt_fp32_steps: int = 12
    settings_before: dict[str, Any] = field(default_factory=dict)
    guard_seen: list[str] = field(default_factory=list)
    sessions: dict[str, tuple[dict[str, Any] | None, dict[str, Any], str | None]] = field(default_factory=dict)

    @property
    def guard_log(self) -> Path:
        """Where the children's guards note refused calls."""
        return self.work / "guard.log"

    def why_missing(self, need: str) -> str | None:
        """Why ``need`` (``nvml`` or ``cuda``) is missing, or ``None`` when it is there."""
        return self.nvml_reason if need == "nvml" else self.cuda_reason

    def dtpo(self, *args: str) -> list[str]:
        """The command line of ``dtpo ARGS`` with this interpreter."""
        return [self.python, "-m", "dtpo", *args]


@contextlib.contextmanager
def nvml_handle(index: int) -> Iterator[tuple[Any, Any]]:
    """``(pynvml, handle)`` of one GPU, with NVML initialised for the block."""
    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    try:
        yield nvml, nvml.nvmlDeviceGetHandleByIndex(index)
    finally:
        nvml.nvmlShutdown()


def open_dtpo_gpu() -> Any:
    """dtpo's device for the first GPU this process sees (the others closed)."""
    from dtpo.devices.nvml import open_nvml_gpus

    gpus = open_nvml_gpus()
    for extra in gpus[1:]:
        extra.close()
    return gpus[0]


# -- the checks ----------------------------------------------------------------------------------------------------


def check_nvml_energy(ctx: Context, limit: Limit) -> list[Row]:
    """1: the energy counter against polled power under a steady load (idle without CUDA), raw and through dtpo."""
    load: subprocess.Popen[str] | None = None
    load_note = "idle GPU (no CUDA: no load)"
    gpu = open_dtpo_gpu()
    try:
        if ctx.cuda_reason is None:
            ready = ctx.work / "load.ready"
            load = subprocess.Popen([ctx.python, str(PARTS), "load", "--seconds", f"{WARM_S + ctx.load_s + 2:.1f}",
                                     "--ready", str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=ctx.env, cwd=REPO, start_new_session=True)
            wait_until = time.monotonic() + min(90.0, limit.left())
            while not ready.exists() and load.poll() is None and time.monotonic() < wait_until:
                time.sleep(0.1)
            if not ready.exists():
                if load.poll() is None:
                    _kill_group(load)
                _, err = load.communicate()
                return [Row("1 nvml-energy", f"the bf16 load did not start: {last_line(err)}", verdict="fail")]
            time.sleep(WARM_S)
            load_note = "steady bf16 matmul load"
        with nvml_handle(gpu.index) as (nvml, handle):
            def counter() -> int:
                return nvml.nvmlDeviceGetTotalEnergyConsumption(handle)

            try:
                counter()
                read_counter: Callable[[], int] | None = counter
            except nvml.NVMLError:
                read_counter = None
            window = measure_window(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, ctx.load_s,
                                    read_counter_mj=read_counter, read_other_j=gpu.energy_j)
        if load is not None:
            if load.poll() is not None:
                return [Row("1 nvml-energy", "the load ended inside the window: " + last_line(load.communicate()[1]),
                            verdict="fail")]
            try:
                out, _ = load.communicate(timeout=WARM_S + 10)
                stats = json.loads(out.strip().splitlines()[-1])
                load_note += f" ({stats['tflops']:.0f} TFLOP/s)"
            except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError, TypeError):
                pass
    finally:
        if load is not None and load.poll() is None:
            _kill_group(load)
        source = gpu.info.source
        gpu.close()
    goal = f"|diff| <= {COUNTER_TOLERANCE:.0%}"
    rows = []
    raw = window.counter()
    if raw is None:
        rows.append(Row("1 nvml-energy (raw)", f"{gpu.info.name} ({source} for dtpo): no energy counter (NVML: "
                        f"not supported); {load_note}", "", goal, "report"))
    else:
        rows.append(Row("1 nvml-energy (raw)", f"{gpu.info.name} ({source} for dtpo), {load_note}: "
                        + raw.describe("counter"), f"{round(raw.difference, 4) + 0.0:+.2%}", goal, raw.verdict()))
    ours = window.other()
    assert ours is not None
    rows.append(Row("1 nvml-energy (dtpo)", f"dtpo's {gpu.info.name} via {source}: " + ours.describe(source),
                    f"{round(ours.difference, 4) + 0.0:+.2%}", goal, ours.verdict()))
    return rows


def check_monitor(ctx: Context, limit: Limit) -> list[Row]:
    """2: ``dtpo monitor`` for a few seconds shows the GPU."""
    path = ctx.work / "monitor.csv"
    child = run_child(ctx.dtpo("monitor", "--duration", "4", "--interval", "1", "--csv", str(path)), ctx.env,
                      min(60.0, limit.left()), ctx.work / "monitor.log")
    text = path.read_text() if path.exists() else ""
    if child.timed_out:
        return [Row("2 monitor", child.why(), "", "GPU shown with power", "fail")]
    result, fig, verdict = judge_monitor(child.returncode, text, child.stdout + child.stderr)
    return [Row("2 monitor", result, fig, "GPU shown with power", verdict)]


def check_knobs(ctx: Context, limit: Limit) -> list[Row]:
    """3: the knobs read through dtpo; dry-run and observe controllers only."""
    gpu = open_dtpo_gpu()
    try:
        return knob_rows(gpu, ctx.work / "knobs-journal.json")
    finally:
        gpu.close()


def train_record(ctx: Context, limit: Limit, name: str, args: Sequence[str]) -> tuple[dict[str, Any] | None, Child]:
    """Run ``dtpo train ARGS`` into ``WORK/name`` and read its record."""
    run_dir = ctx.work / name
    child = run_child(ctx.dtpo("train", *args, "--run-dir", str(run_dir), "--no-report"), ctx.env, limit.left(),
                      ctx.work / f"{name}.log")
    return read_json(run_dir / "record.json"), child


def check_tune(ctx: Context, limit: Limit) -> list[Row]:
    """4: ``dtpo train --tune power-limit --dry-run`` records the tuner's model figure."""
    goal = "model choice recorded, nothing applied, GPU via NVML"
    record, child = train_record(ctx, limit, "tune", ["--workload", "lm", "--workers", "1", "--steps", "300",
                                                      "--tune", "power-limit", "--dry-run"])
    if record is None or child.returncode != 0:
        return [Row("4 tune-dry-run", f"dtpo train: {child.why()}", "", goal, "fail")]
    result, fig, verdict = judge_tuning(record)
    return [Row("4 tune-dry-run", result, fig, goal, verdict)]


def session_run(ctx: Context, precision: str, limit: Limit) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """dtpo's GPT through ``dtpo.Session`` in ``precision`` (run once, then remembered): ``(record, extra, error)``."""
    if precision in ctx.sessions:
        return ctx.sessions[precision]
    tag = precision.replace("-", "_")
    run_dir, out = ctx.work / f"gpt_{tag}", ctx.work / f"gpt_{tag}.json"
    steps = ctx.gpt_steps if precision == "bf16-mixed" else ctx.gpt_fp32_steps
    cmd = [ctx.python, str(PARTS), "session", "--precision", precision, "--steps", str(steps),
           "--run-dir", str(run_dir), "--out", str(out)]
    cmd += ["--count-attention"] if precision == "bf16-mixed" else []
    for flag, key in (("--width", "width"), ("--layers", "layers"), ("--batch", "batch")):
        if ctx.gpt.get(key):
            cmd += [flag, str(ctx.gpt[key])]
    progress(f"  dtpo.Session on dtpo's GPT in {precision}, {steps} steps")
    child = run_child(cmd, ctx.env, limit.left(), ctx.work / f"gpt_{tag}.log")
    record, extra = read_json(run_dir / "record.json"), read_json(out) or {}
    error = None
    if child.returncode != 0 or record is None:
        error = extra.get("error") or child.why()
    elif record.get("status") != "completed":
        error = f"run status {record.get('status')!r}"
    ctx.sessions[precision] = (record, extra, error)
    return ctx.sessions[precision]


def check_precision(ctx: Context, limit: Limit) -> list[Row]:
    """5: bf16-mixed against 32-true on the same GPT: throughput and GPU energy per sample, as ratios."""
    goal = "speed > 1, energy < 1 (bf16 / fp32)"
    runs = {p: session_run(ctx, p, limit) for p in ("bf16-mixed", "32-true")}
    errors = [f"{p}: {one_line(err, 160)}" for p, (_, _, err) in runs.items() if err]
    if errors:
        return [Row("5 bf16-vs-fp32", "; ".join(errors), "", goal, "fail")]
    figures = {}
    for precision, (record, _, _) in runs.items():
        assert record is not None
        speed = figure(record, "throughput")
        per_sample = gpu_energy_per_sample(record)
        figures[precision] = (speed, per_sample[0] if per_sample else None, mfu_problem(record))
    (s_bf, e_bf, p_bf), (s_fp, e_fp, p_fp) = figures["bf16-mixed"], figures["32-true"]
    problems = [p for p in (p_bf, p_fp) if p]
    if not s_bf or not s_fp:
        return [Row("5 bf16-vs-fp32", "a run has no throughput", "", goal, "fail")]
    speed = s_bf / s_fp
    energy = e_bf / e_fp if e_bf and e_fp else None
    if energy is None:
        why = ctx.nvml_reason or "no GPU energy in the records"
        energy_text = f"GPU energy not measured ({why})"
        if ctx.nvml_reason is None:
            problems.append("no GPU energy in the records though NVML works")
    else:
        energy_text = f"GPU {e_bf:.3g} vs {e_fp:.3g} J/sample"
    what = f"{describe_size(runs['bf16-mixed'][1])}: {s_bf:.1f} vs {s_fp:.1f} samples/s; {energy_text}"
    fig = f"speed x{speed:.2f}" + (f", energy x{energy:.3f}" if energy is not None else "")
    ok = speed > 1.0 and (energy is None or energy < 1.0) and not problems
    return [Row("5 bf16-vs-fp32", "; ".join(problems + [what]), fig, goal, "pass" if ok else "fail")]


def check_mfu(ctx: Context, limit: Limit) -> list[Row]:
    """6: the MFU dtpo reports for its GPT in bf16, against the GPU's goal and 100 %."""
    record, extra, error = session_run(ctx, "bf16-mixed", limit)
    name = extra.get("gpu") or ctx.gpu_name
    goal_text, _ = mfu_verdict(None, name)
    if error:
        return [Row("6 mfu", f"dtpo.Session in bf16: {one_line(error, 200)}", "", goal_text, "fail")]
    assert record is not None
    mfu, note = mfu_of(record)
    goal_text, verdict = mfu_verdict(mfu, name)
    if mfu is None:
        return [Row("6 mfu", f"the record has no MFU ({one_line(note, 200) or 'no note'})", "", goal_text, "fail")]
    peak = ((record.get("ranks") or [{}])[0] or {}).get("peak_flops") or {}
    share = extra.get("attention_share")
    fig = f"{mfu:.1%}"
    if isinstance(share, int | float):
        fig += f" ({mfu * (1 - share / 2):.1%} with causal attention at half)"
    peak_text = (f"peak {(peak.get('value') or 0) / 1e12:.3g} TFLOP/s ({peak.get('note', '?')})" if peak
                 else "no peak")
    what = (f"{describe_size(extra)} in bf16-mixed on {name}: {figure(record, 'throughput') or 0:.1f} samples/s, "
            f"{peak_text}; torch's counter counts causal attention in full"
            + (f" ({share:.1%} of the FLOPs are attention)" if isinstance(share, int | float) else ""))
    return [Row("6 mfu", what, fig, goal_text, verdict)]


def check_breakdown(ctx: Context, limit: Limit) -> list[Row]:
    """7: the step breakdown of a 1-GPU NCCL run sums to the step time."""
    goal = f"parts = step within {BREAKDOWN_TOLERANCE:.0%} + {BREAKDOWN_SLACK_S * 1000:.1f} ms"
    record, child = train_record(ctx, limit, "nccl", ["--workload", "lm", "--workers", "1", "--steps", "60",
                                                      "--backend", "nccl", "--knob-mode", "observe"])
    if record is None or child.returncode != 0:
        return [Row("7 nccl-breakdown", f"dtpo train: {child.why()}", "", goal, "fail")]
    result, fig, verdict = judge_breakdown(record)
    return [Row("7 nccl-breakdown", result, fig, goal, verdict)]


def check_untouched(ctx: Context, limit: Limit) -> list[Row]:
    """8: the GPU's settings are as they were and no NVML setter was called, here or in any child."""
    with nvml_handle(ctx.gpu_index) as (nvml, handle):
        after = read_settings(nvml, handle)
    changes = settings_changes(ctx.settings_before, after)
    refused = list(ctx.guard_seen)
    if ctx.guard_log.exists():
        refused += [line.split(" ", 1)[-1] for line in ctx.guard_log.read_text().splitlines() if line.strip()]
    known = {k: v for k, v in after.items() if v is not None}
    what = f"{ctx.gpu_label}: " + (", ".join(f"{k} {v}" for k, v in known.items()) or "no setting readable")
    problems = ([f"changed: {'; '.join(changes)}"] if changes else []) + (
        [f"NVML setters called (refused): {', '.join(sorted(set(refused)))}"] if refused else [])
    goal = "settings as before, no setter called"
    if problems:
        return [Row("8 untouched", "; ".join(problems), f"{len(changes)} changed", goal, "fail")]
    return [Row("8 untouched", what, "0 changed, 0 setter calls", goal, "pass")]


@dataclass(frozen=True)
class Check:
    """One check: its number, name, what it needs (``nvml``, ``cuda``), its time limit and its function;
    ``always`` runs even when the budget is spent (the last look at the GPU's settings, under a second)."""

    number: str
    name: str
    needs: tuple[str, ...]
    timeout_s: float
    run: Callable[[Context, Limit], list[Row]]
    always: bool = False

    @property
    def label(self) -> str:
        """``"1 nvml-energy"``."""
        return f"{self.number} {self.name}"


CHECKS = (
    Check("1", "nvml-energy", ("nvml",), 60.0, check_nvml_energy),  # plus --load-s
    Check("2", "monitor", ("nvml",), 60.0, check_monitor),
    Check("3", "knobs", ("nvml",), 30.0, check_knobs),
    Check("4", "tune-dry-run", ("nvml", "cuda"), 150.0, check_tune),
    Check("5", "bf16-vs-fp32", ("cuda",), 240.0, check_precision),
    Check("6", "mfu", ("cuda",), 150.0, check_mfu),
    Check("7", "nccl-breakdown", ("cuda",), 150.0, check_breakdown),
    Check("8", "untouched", ("nvml",), 20.0, check_untouched, always=True),
)


def missing_reason(ctx: Context, check: Check) -> str | None:
    """Why ``check`` cannot run here (``no CUDA: ...``, ``no NVML: ...``), or ``None``."""
    reasons = [f"no {need.upper() if need == 'cuda' else 'NVML'}: {why}" for need in check.needs
               if (why := ctx.why_missing(need)) is not None]
    return "; ".join(reasons) or None


def run_one(ctx: Context, check: Check, deadline: float) -> list[Row]:
    """Run one check in a thread of its own, so that a hung one costs its time limit and the others still run."""
    timeout = check.timeout_s + (ctx.load_s + WARM_S if check.name == "nvml-energy" else 0.0)
    limit = Limit(min(time.monotonic() + timeout, deadline))
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(check.run(ctx, limit))
        except BaseException as exc:  # noqa: BLE001 - a check's failure is its row, never the script's end
            box.append(exc)

    thread = threading.Thread(target=target, name=f"check-{check.name}", daemon=True)
    thread.start()
    thread.join(limit.deadline - time.monotonic() + 20.0)  # children are killed at the limit; then some slack
    if thread.is_alive():
        return [Row(check.label, f"timed out after {timeout:.0f} s", verdict="fail")]
    outcome = box[0]
    if isinstance(outcome, BaseException):
        return [Row(check.label, f"error: {type(outcome).__name__}: {one_line(outcome, 200)}", verdict="fail")]
    return outcome


def run_checks(ctx: Context, checks: Sequence[Check], budget_s: float) -> list[Row]:
    """Every check in turn within ``budget_s``; those that cannot run here get a ``skip`` row saying why."""
    deadline = time.monotonic() + budget_s
    rows: list[Row] = []
    for n, check in enumerate(checks, 1):
        reason = missing_reason(ctx, check)
        if reason is None and deadline - time.monotonic() < MIN_CHECK_S and not check.always:
            reason = f"the time budget (--budget-s {budget_s:g}) is spent"
        if reason is not None:
            rows.append(Row(check.label, f"could not run: {reason}", verdict="skip"))
            progress(f"{n}/{len(checks)} {check.name}: could not run: {reason}")
            continue
        progress(f"{n}/{len(checks)} {check.name}: running")
        started = time.monotonic()
        got = run_one(ctx, check, max(deadline, time.monotonic() + check.timeout_s) if check.always else deadline)
        rows += got
        verdicts = ", ".join(row.verdict for row in got)
        progress(f"{n}/{len(checks)} {check.name}: {verdicts} ({time.monotonic() - started:.0f} s)")
    return rows


# -- setting up ----------------------------------------------------------------------------------------------------


def child_env(work: Path, guard_dir: Path) -> dict[str, str]:
    """The environment of every child: the guard's ``sitecustomize`` and ``src`` first on ``PYTHONPATH``, dtpo's
    state, cache and run store in the work folder (no journal of this machine's is read or written)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(guard_dir), str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    env.update({key: str(work / name) for key, name in SETTINGS_ENV.items()})
    env[GUARD_LOG_ENV] = str(work / "guard.log")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def probe_nvml(ctx: Context) -> None:
    """Fill the NVML part of ``ctx``: the first GPU's index and name and its settings, or why NVML is unusable.
    Where ``CUDA_VISIBLE_DEVICES`` is unset, the children see that GPU only (by UUID)."""
    try:
        gpu = open_dtpo_gpu()
    except Exception as exc:  # noqa: BLE001 - DeviceError's one line, or dtpo itself failing to import
        ctx.nvml_reason = one_line(exc, 200)
        return
    try:
        ctx.gpu_index, ctx.gpu_name = gpu.index, gpu.info.name.split(" (", 1)[-1].rstrip(")")
        ctx.gpu_label = f"{gpu.info.name} via {gpu.info.source}"
        ctx.virtual = getattr(gpu, "virtual", None) is not None
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            ctx.env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
        with nvml_handle(gpu.index) as (nvml, handle):
            ctx.settings_before = read_settings(nvml, handle)
            with contextlib.suppress(Exception):
                driver = nvml.nvmlSystemGetDriverVersion()
                ctx.probe["driver"] = driver.decode() if isinstance(driver, bytes) else driver
    finally:
        gpu.close()


def probe_cuda(ctx: Context) -> None:
    """Fill the CUDA part of ``ctx`` from ``gpu_check_parts.py probe`` (torch is imported there, not here)."""
    child = run_child([ctx.python, str(PARTS), "probe"], ctx.env, 120.0, ctx.work / "probe.log")
    try:
        found = json.loads(child.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        ctx.cuda_reason = f"the torch probe failed ({child.why()})"
        return
    ctx.probe.update(found)
    if not found.get("cuda"):
        ctx.cuda_reason = found.get("reason") or "CUDA unavailable"
    elif not ctx.gpu_name:
        ctx.gpu_name = found.get("name") or ""


def environment_row(ctx: Context, requirements: Sequence[str]) -> Row:
    """Check 0: interpreter, torch and CUDA, GPU and driver, the guard in children, and dtpo's runtime dependencies
    (missing ones, or a CLI that cannot be imported, fail where a GPU is there to check; other versions warn)."""
    found, missing, other = dependency_report(requirements, installed_version)
    probe = ctx.probe
    torch_text = (f"torch {probe.get('torch')}" + (f" (CUDA {probe.get('cuda_version')})" if probe.get("cuda_version")
                                                  else "") if probe.get("torch") else "no torch")
    gpu_text = ctx.gpu_name or "no GPU"
    if probe.get("driver"):
        gpu_text += f", driver {probe['driver']}"
    guard = {True: "NVML setters refused in children", False: "NVML guard OFF", None: "no pynvml"}[probe.get("guarded")]
    what = (f"python {sys.version.split()[0]} ({ctx.python}); {torch_text}; {gpu_text}; {guard}; dtpo's "
            "dependencies: " + ", ".join(found))
    problems, figures = [], []
    if probe.get("guarded") is False:  # pynvml there, and setters not refused: the children could change the GPU
        problems.append(f"the NVML guard is off in child processes (their sitecustomize did not run: see "
                        f"{ctx.work / 'probe.log'})")
        figures.append("guard off")
    if missing:
        problems.append(f"missing: {', '.join(missing)} (pip install them; with no network, their wheels unpacked "
                        "onto PYTHONPATH)")
        figures.append(f"{len(missing)} missing")
    if probe.get("cli_error"):
        problems.append(f"dtpo's CLI cannot be imported: {probe['cli_error']}")
        figures.append("CLI import fails")
    if other:
        problems.append(f"other versions: {'; '.join(other)}")
        figures.append(f"{len(other)} other versions")
    goal = "dependencies present, guard on"
    if not problems:
        return Row("0 environment", what, "all present", goal, "pass")
    serious = bool(missing or probe.get("cli_error") or probe.get("guarded") is False)
    anything = ctx.nvml_reason is None or ctx.cuda_reason is None  # a check that needs them could run
    verdict = "fail" if serious and anything else "warn"
    return Row("0 environment", "; ".join(problems + [what]), ", ".join(figures), goal, verdict)


def select_checks(only: str | None) -> list[Check]:
    """The checks ``--only`` names (numbers or names, comma-separated), in their order; all without it.

    Raises:
        ValueError: A name that is no check.
    """
    if not only:
        return list(CHECKS)
    wanted = {part.strip() for part in only.split(",") if part.strip()}
    known = {c.number for c in CHECKS} | {c.name for c in CHECKS}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise ValueError(f"--only: unknown check {', '.join(unknown) or repr(only)} (choose from "
                         + ", ".join(c.label for c in CHECKS) + ")")
    return [c for c in CHECKS if c.number in wanted or c.name in wanted]


def parse_options(argv: Sequence[str] | None) -> Any:
    """The command line; a bad flag is one line and exit 2."""
    parser = OneLineParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument("--only", help="comma-separated check numbers or names (default: all)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="wall time for all checks (default 480)")
    parser.add_argument("--load-s", type=float, default=15.0, help="seconds of the energy window of check 1")
    parser.add_argument("--work-dir", type=Path, help="folder for runs and logs (default: a new temporary one)")
    parser.add_argument("--gpt-width", type=int, help="d_model of the GPT of checks 5 and 6 (default by memory)")
    parser.add_argument("--gpt-layers", type=int, help="its layers (default 4)")
    parser.add_argument("--gpt-batch", type=int, help="its sequences per step (default by memory)")
    options = parser.parse_args(argv)
    if not (math.isfinite(options.budget_s) and options.budget_s > 0):
        bad_flag(parser.prog, f"--budget-s must be a positive number of seconds, got {options.budget_s:g}")
    if not (math.isfinite(options.load_s) and 1 <= options.load_s <= 120):
        bad_flag(parser.prog, f"--load-s must be between 1 and 120 seconds, got {options.load_s:g}")
    for flag in ("gpt_width", "gpt_layers", "gpt_batch"):
        value = getattr(options, flag)
        if value is not None and value < 1:
            bad_flag(parser.prog, f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if options.gpt_width is not None and options.gpt_width % 128:
        bad_flag(parser.prog, f"--gpt-width must be a multiple of 128 (heads of 128), got {options.gpt_width}")
    if options.out is not None and (options.out.is_dir() or not options.out.absolute().parent.is_dir()):
        bad_flag(parser.prog, f"--out {options.out}: not a file in an existing directory")
    if options.work_dir is not None and options.work_dir.exists() and not options.work_dir.is_dir():
        bad_flag(parser.prog, f"--work-dir {options.work_dir}: exists and is not a directory")
    try:
        options.checks = select_checks(options.only)
    except ValueError as exc:
        bad_flag(parser.prog, str(exc))
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; 0 when none failed, 1 otherwise."""
    options = parse_options(argv)
    work = options.work_dir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    guard_dir = work / "guard"
    guard_dir.mkdir(exist_ok=True)
    (guard_dir / "sitecustomize.py").write_text(sitecustomize_text(PARTS))
    ctx = Context(python=sys.executable, work=work, env=child_env(work, guard_dir), load_s=options.load_s,
                  gpt={"width": options.gpt_width, "layers": options.gpt_layers, "batch": options.gpt_batch})
    for key, name in SETTINGS_ENV.items():
        os.environ[key] = str(work / name)  # dtpo in this process too: no machine journal, cache or store
    with contextlib.suppress(ImportError):
        install_guard(importlib.import_module("pynvml"), ctx.guard_log, ctx.guard_seen)
    progress(f"work folder {work}; python {sys.executable}")
    probe_nvml(ctx)
    probe_cuda(ctx)
    progress(f"NVML: {ctx.nvml_reason or 'ok, ' + ctx.gpu_label}; CUDA: {ctx.cuda_reason or 'ok'}")
    rows = [environment_row(ctx, runtime_requirements())]
    checks = options.checks
    if ctx.nvml_reason is not None and ctx.cuda_reason is not None:
        rows += [Row(c.label, f"could not run: {missing_reason(ctx, c)}", verdict="skip") for c in checks]
        print(no_gpu_line(ctx.nvml_reason, ctx.cuda_reason, [c.label for c in checks]))
        if options.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)  # nothing ran: nothing to keep
    else:
        rows += run_checks(ctx, checks, options.budget_s)
        skipped = [row.check for row in rows if row.verdict == "skip"]
        if skipped:
            print("could not run: " + "; ".join(f"{row.check} ({row.result.removeprefix('could not run: ')})"
                                                for row in rows if row.verdict == "skip"))
    where = ctx.gpu_name or "a machine without a GPU"
    if ctx.virtual:
        where = f"a VIRTUAL {where} (dtpo's NVML stand-in: every NVML figure simulated, not measured)"
        print(f"gpu-check on {where}")
    print(format_table(rows))
    if options.out is not None:
        title = f"gpu-check on {where} ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
        options.out.write_text(title + markdown_table(rows))
        progress(f"table written to {options.out}")
    code = exit_code(rows)
    progress(f"{'a check failed' if code else 'no check failed'}"
             + (f"; logs and runs in {work}" if work.exists() else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
