"""The verdicts of ``benchmarks/gpu_check.py``: its table, the energy counter against polled power, MFU goals, what
a run's record must hold for checks 4 to 7, dtpo's dependencies against ``pyproject.toml``, and the GPU settings
compared before and after. Pure functions, tested in ``tests/test_gpu_check.py`` without a GPU.
"""

from __future__ import annotations

import csv
import io
import math
import re
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

COUNTER_TOLERANCE = 0.02  # check 1: counter and polled mean power within 2 %
MFU_GOAL = 0.40  # check 6, on the GPUs named below
MFU_GOAL_GPUS = ("NVIDIA H100", "NVIDIA H200")  # catalogue names (dtpo.devices.physics.catalogue) the goal holds for
BREAKDOWN_TOLERANCE = 0.01  # check 7: parts within 1 % of the step ...
BREAKDOWN_SLACK_S = 1e-4  # ... plus 0.1 ms
GPU_SOURCES = ("nvml-counter", "nvml-polled")
POLL_PERIOD_S = 0.1
VERDICTS = ("pass", "fail", "warn", "report", "skip")


def one_line(text: object, limit: int = 240) -> str:
    """``text`` squeezed onto one line of at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


# -- rows and the table --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table.

    Attributes:
        check: Number and name, e.g. ``"1 nvml-energy"``.
        result: What was measured, or ``could not run: <why>``.
        figure: The number the verdict is on.
        goal: What the figure must be.
        verdict: One of :data:`VERDICTS`: ``report`` has no goal here, ``skip`` could not run.
    """

    check: str
    result: str
    figure: str = ""
    goal: str = ""
    verdict: str = "report"

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")


COLUMNS = ("check", "result", "figure", "goal", "verdict")
WIDTHS = {"check": 24, "result": 64, "figure": 30, "goal": 24, "verdict": 7}


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a plain-text table, long cells wrapped within their column."""
    cells = [[textwrap.wrap(getattr(row, col), WIDTHS[col]) or [""] for col in COLUMNS] for row in rows]
    widths = [max([len(col)] + [len(line) for row in cells for line in row[i]]) for i, col in enumerate(COLUMNS)]
    rule = "  ".join("-" * w for w in widths)
    lines = ["  ".join(col.ljust(w) for col, w in zip(COLUMNS, widths, strict=True)).rstrip(), rule]
    for row in cells:
        for k in range(max(len(c) for c in row)):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(row, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table (``|`` in a cell escaped)."""
    def cell(text: str) -> str:
        return one_line(text, 10_000).replace("|", "\\|")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(getattr(row, col)) for col in COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def exit_code(rows: Sequence[Row]) -> int:
    """1 when any row failed, else 0 (a check that could not run is no failure)."""
    return 1 if any(row.verdict == "fail" for row in rows) else 0


def no_gpu_line(nvml_reason: str | None, cuda_reason: str | None, skipped: Sequence[str]) -> str:
    """The line for a machine where no check could run: why, and which checks."""
    reasons = [f"NVML: {nvml_reason}" if nvml_reason else "", f"CUDA: {cuda_reason}" if cuda_reason else ""]
    why = "; ".join(r for r in reasons if r) or "no NVIDIA GPU found"
    return f"no GPU here: {why}. Could not run: {', '.join(skipped)}"


# -- check 1: counter against polled power -------------------------------------------------------------------------


def trapezoid(samples: Sequence[tuple[float, float]]) -> float:
    """Joules from ``(seconds, watts)`` samples in time order, by the trapezoid rule."""
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in zip(samples, samples[1:], strict=False))


@dataclass(frozen=True)
class Agreement:
    """A measured energy against the polled power over (about) the same window.

    Attributes:
        energy_j: The measured energy (counter or dtpo device).
        seconds: The time it was measured over.
        polled_j: Polled power integrated by trapezoids.
        polled_s: The time from the first poll to the last.
        polls: How many polls.
    """

    energy_j: float
    seconds: float
    polled_j: float
    polled_s: float
    polls: int

    @property
    def mean_w(self) -> float:
        """Mean power of the measured energy."""
        return self.energy_j / self.seconds if self.seconds > 0 else math.nan

    @property
    def polled_w(self) -> float:
        """Mean polled power."""
        return self.polled_j / self.polled_s if self.polled_s > 0 else math.nan

    @property
    def difference(self) -> float:
        """Relative difference of the mean powers, measured against polled (signed; nan without polled power)."""
        polled = self.polled_w
        return (self.mean_w - polled) / polled if polled > 0 else math.nan

    def verdict(self, tolerance: float = COUNTER_TOLERANCE) -> str:
        """``pass`` within the tolerance, else ``fail`` (also with too few polls to integrate)."""
        return "pass" if self.polls >= 2 and abs(self.difference) <= tolerance else "fail"

    def describe(self, what: str) -> str:
        """One line: both energies, their times and mean powers."""
        return (f"{what} {self.energy_j / 1000:.3f} kJ in {self.seconds:.2f} s ({self.mean_w:.1f} W) vs polled "
                f"{self.polled_j / 1000:.3f} kJ in {self.polled_s:.2f} s ({self.polled_w:.1f} W, {self.polls} polls)")


def agreement(energy_j: float, seconds: float, samples: Sequence[tuple[float, float]]) -> Agreement:
    """Compare an energy with the integral of polled power (mean powers, so windows a poll apart compare)."""
    span = samples[-1][0] - samples[0][0] if len(samples) >= 2 else 0.0
    return Agreement(energy_j, seconds, trapezoid(samples), span, len(samples))


@dataclass
class Window:
    """What one energy window read: the raw counter, polled power, and an energy reader's (dtpo's) joules.

    Attributes:
        counter_mj: The counter at the start and end (``None`` without a counter).
        counter_t: When the counter was read.
        samples: ``(seconds, watts)`` polls.
        other_j: The other reader's joules at the start and end (``None`` without one).
        other_t: When it was read.
    """

    counter_mj: tuple[int, int] | None
    counter_t: tuple[float, float]
    samples: list[tuple[float, float]]
    other_j: tuple[float, float] | None = None
    other_t: tuple[float, float] = (0.0, 0.0)

    def counter(self) -> Agreement | None:
        """The raw counter against polled power (``None`` without a counter)."""
        if self.counter_mj is None:
            return None
        return agreement((self.counter_mj[1] - self.counter_mj[0]) / 1000.0,
                         self.counter_t[1] - self.counter_t[0], self.samples)

    def other(self) -> Agreement | None:
        """The other reader against polled power (``None`` without one)."""
        if self.other_j is None:
            return None
        return agreement(self.other_j[1] - self.other_j[0], self.other_t[1] - self.other_t[0], self.samples)


def measure_window(read_power_w: Callable[[], float], seconds: float, *,
                   read_counter_mj: Callable[[], int] | None = None,
                   read_other_j: Callable[[], float] | None = None, period_s: float = POLL_PERIOD_S,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Window:
    """Read the counter (and the other reader), poll power every ``period_s`` for ``seconds``, read them again.

    Polls are scheduled on a fixed grid from the start, so a slow poll does not shift the rest.
    """
    def read_pair() -> tuple[int | None, float, float | None, float]:
        t_counter = clock()
        counter = int(read_counter_mj()) if read_counter_mj is not None else None
        t_other = clock()
        other = float(read_other_j()) if read_other_j is not None else None
        return counter, t_counter, other, t_other

    c0, tc0, o0, to0 = read_pair()
    samples: list[tuple[float, float]] = []
    start = clock()
    tick = 0
    while True:
        now = clock()
        samples.append((now, float(read_power_w())))
        if now - start >= seconds:
            break
        tick += 1
        wait = start + tick * period_s - clock()
        if wait > 0:
            sleep(wait)
    c1, tc1, o1, to1 = read_pair()
    return Window(None if c0 is None or c1 is None else (c0, c1), (tc0, tc1), samples,
                  None if o0 is None or o1 is None else (o0, o1), (to0, to1))


# -- check 6 and every record: MFU ---------------------------------------------------------------------------------


def mfu_goal(gpu_name: str) -> float | None:
    """The MFU goal for a GPU as CUDA or NVML names it: :data:`MFU_GOAL` on an H100 or H200, else none."""
    from dtpo.devices.physics.catalogue import find_gpu

    spec = find_gpu(gpu_name)
    return MFU_GOAL if spec is not None and spec.name.startswith(MFU_GOAL_GPUS) else None


def mfu_verdict(mfu: float | None, gpu_name: str) -> tuple[str, str]:
    """``(goal, verdict)`` for an MFU: above 100 % fails everywhere (a wrong peak or FLOP count); below the GPU's
    goal fails; with no goal for this GPU it is reported."""
    goal = mfu_goal(gpu_name)
    goal_text = f">= {goal:.0%} on {gpu_name}, <= 100 %" if goal is not None else f"<= 100 % (no goal on {gpu_name})"
    if mfu is None or not math.isfinite(mfu) or mfu <= 0:
        return goal_text, "fail"
    if mfu > 1.0:
        return goal_text, "fail"
    if goal is None:
        return goal_text, "report"
    return goal_text, "pass" if mfu >= goal else "fail"


def figure(record: dict[str, Any], name: str) -> float | None:
    """A run-level figure's value from ``record["totals"]`` (``None`` where absent)."""
    entry = (record.get("totals") or {}).get(name)
    value = entry.get("value") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) else None


def mfu_of(record: dict[str, Any]) -> tuple[float | None, str]:
    """``(MFU, note)`` of a record. dtpo never writes an MFU above 100 %: it writes none, with the figure in the
    note (``rank 0 came out at 243% of its peak ...``); that figure is returned then, so it fails like one."""
    entry = (record.get("totals") or {}).get("mfu")
    entry = entry if isinstance(entry, dict) else {}
    note = str(entry.get("note") or "")
    value = entry.get("value")
    if isinstance(value, int | float):
        return float(value), note
    withheld = re.search(r"came out at ([0-9.]+)% of its peak", note)
    return (float(withheld.group(1)) / 100.0 if withheld else None), note


def mfu_problem(record: dict[str, Any]) -> str | None:
    """Why a record's MFU cannot be right (above 100 %, or withheld by dtpo for being so), or ``None``."""
    mfu, note = mfu_of(record)
    if mfu is not None and mfu > 1.0:
        return f"MFU {mfu:.0%} is above 100 %: a wrong peak or FLOP count ({one_line(note, 160)})"
    return None


# -- records: devices, energy per sample, tuning, breakdown ---------------------------------------------------------


def gpu_devices(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0's GPU devices as its energy section lists them."""
    ranks = record.get("ranks") or [{}]
    devices = ((ranks[0] or {}).get("energy") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, dict) and d.get("kind") == "gpu"]


def gpu_energy_per_sample(record: dict[str, Any]) -> tuple[float, int, float] | None:
    """``(GPU joules per sample, samples, seconds)`` over rank 0's energy windows, GPUs only (the CPU's modelled
    energy left out); ``None`` without GPU energy or samples."""
    rank = (record.get("ranks") or [{}])[0] or {}
    names = {d.get("name") for d in gpu_devices(record)}
    windows = (rank.get("energy") or {}).get("windows") or []
    steps = {s.get("step"): s for s in rank.get("steps") or []}
    joules, samples, seconds = 0.0, 0, 0.0
    for window in windows:
        energy = window.get("energy_j") or {}
        if not names & set(energy):
            continue
        joules += sum(float(energy[n]) for n in names if n in energy)
        seconds += float(window.get("time_s") or 0.0)
        samples += sum(int(steps[i].get("samples") or 0) for i in range(window["first_step"], window["last_step"] + 1)
                       if i in steps)
    if not names or samples <= 0 or joules <= 0:
        return None
    return joules / samples, samples, seconds


def judge_tuning(record: dict[str, Any]) -> tuple[str, str, str]:
    """``(result, figure, verdict)`` of a ``--tune power-limit --dry-run`` record: the tuner's model choice is
    there, nothing was applied, and the GPU's energy came from NVML."""
    problems = []
    if record.get("status") != "completed":
        problems.append(f"run status {record.get('status')!r}")
    rank = (record.get("ranks") or [{}])[0] or {}
    tuning = rank.get("tuning") or {}
    model = tuning.get("model") or {}
    choice = model.get("choice") or {}
    watts = choice.get("power_limit_w")
    if tuning.get("source") != "model":
        problems.append(f"tuning source {tuning.get('source')!r}, not 'model'")
    if tuning.get("mode") != "dry-run":
        problems.append(f"knob mode {tuning.get('mode')!r}, not 'dry-run'")
    if tuning.get("applied"):
        problems.append("the record says settings were applied")
    if not isinstance(watts, int | float):
        problems.append("no model choice: " + one_line(model.get("note") or tuning.get("note") or "none recorded"))
    sources = sorted({str(d.get("source")) for d in gpu_devices(record)})
    if not sources:
        problems.append("no GPU among the measured devices")
    elif not set(sources) <= set(GPU_SOURCES):
        problems.append(f"GPU energy source {', '.join(sources)}, not nvml-counter/nvml-polled")
    if (problem := mfu_problem(record)) is not None:
        problems.append(problem)
    clock = choice.get("sm_clock_mhz")
    fig = (f"would choose {watts:g} W" + (f", SM {clock} MHz" if clock else "") + " (model figure)"
           if isinstance(watts, int | float) else "no choice")
    what = f"GPU energy via {', '.join(sources) or 'nothing'}; {one_line(model.get('model') or '', 120)}"
    if problems:
        return "; ".join(problems) + f" ({what})", fig, "fail"
    return what, fig, "pass"


def step_gap(step: dict[str, Any]) -> float:
    """Seconds between a step's time and the sum of its parts (data wait, compute, exposed communication, sync
    wait, optimizer; the unsplit tail where neither communication part was filled)."""
    comm, sync = step.get("comm_exposed_s"), step.get("sync_wait_s")
    parts = float(step.get("data_wait_s") or 0.0) + float(step.get("compute_s") or 0.0)
    parts += float(step.get("optimizer_s") or 0.0)
    if comm is None and sync is None:
        parts += float(step.get("tail_s") or 0.0)
    else:
        parts += float(comm or 0.0) + float(sync or 0.0)
    return abs(float(step["step_s"]) - parts)


def judge_breakdown(record: dict[str, Any]) -> tuple[str, str, str]:
    """``(result, figure, verdict)`` of a 1-GPU NCCL run: nccl and CUDA in the record, and every measured step's
    parts within :data:`BREAKDOWN_TOLERANCE` of its time plus :data:`BREAKDOWN_SLACK_S`."""
    problems = []
    environment = record.get("environment") or {}
    rank = (record.get("ranks") or [{}])[0] or {}
    if record.get("status") != "completed":
        problems.append(f"run status {record.get('status')!r}")
    if environment.get("backend") != "nccl":
        problems.append(f"backend {environment.get('backend')!r}, not nccl")
    if not str(rank.get("device") or environment.get("device") or "").startswith("cuda"):
        problems.append(f"device {rank.get('device')!r}, not CUDA")
    steps = [s for s in rank.get("steps") or [] if not s.get("warmup") and s.get("step_s")]
    if not steps:
        problems.append("no measured step in the record")
        return "; ".join(problems), "no steps", "fail"
    worst = max(steps, key=lambda s: step_gap(s) - BREAKDOWN_TOLERANCE * float(s["step_s"]))
    gap = step_gap(worst)
    bad = [s for s in steps if step_gap(s) > BREAKDOWN_TOLERANCE * float(s["step_s"]) + BREAKDOWN_SLACK_S]
    if bad:
        problems.append(f"{len(bad)} of {len(steps)} steps' parts do not sum to the step time")
    if (problem := mfu_problem(record)) is not None:
        problems.append(problem)
    total = sum(float(s["step_s"]) for s in steps)
    shares = {name: sum(float(s.get(key) or 0.0) for s in steps) / total
              for name, key in (("data", "data_wait_s"), ("compute", "compute_s"), ("comm", "comm_exposed_s"),
                                ("sync", "sync_wait_s"), ("optimizer", "optimizer_s"))}
    what = (f"{len(steps)} steps on {rank.get('device')} over {environment.get('backend')}, median step "
            f"{sorted(float(s['step_s']) for s in steps)[len(steps) // 2] * 1000:.2f} ms: "
            + ", ".join(f"{name} {share:.1%}" for name, share in shares.items()))
    fig = f"largest gap {gap * 1000:.3f} ms ({gap / float(worst['step_s']):.2%}, step {worst.get('step')})"
    if problems:
        return "; ".join(problems) + f" ({what})", fig, "fail"
    return what, fig, "pass"


def judge_monitor(returncode: int, csv_text: str, stdout: str) -> tuple[str, str, str]:
    """``(result, figure, verdict)`` of ``dtpo monitor --csv``: it ended well and showed a GPU with power."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    gpus: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        if re.match(r"gpu\d+ ", row.get("device") or ""):
            gpus.setdefault(row["device"], []).append(row)
    if returncode != 0:
        return f"dtpo monitor exited {returncode}: {last_line(stdout)}", "", "fail"
    if not gpus:
        seen = sorted({r.get("device") or "?" for r in rows})
        return f"no GPU among the readings (devices: {', '.join(seen) or 'none'})", "", "fail"
    name, readings = next(iter(gpus.items()))
    watts = [float(r["power_w"]) for r in readings if _finite(r.get("power_w"))]
    source = readings[0].get("source") or "?"
    shown = name in stdout or name.split(" ", 1)[0] in stdout
    what = f"{name} via {source}: {len(readings)} readings" + ("" if shown else " (not in its printed output)")
    if not watts or max(watts) <= 0:
        return what + ", no power read", "", "fail"
    mean = f"{sum(watts) / len(watts):.1f} W mean"
    return what, mean, "pass" if shown else "fail"


def _finite(text: str | None) -> bool:
    try:
        return math.isfinite(float(text or "nan"))
    except ValueError:
        return False


def last_line(text: str) -> str:
    """The most telling line of a child's output: its last error line, else its last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|refuses|Traceback", line)]
    return one_line(errors[-1] if errors else lines[-1] if lines else "no output")


def describe_size(extra: dict[str, Any]) -> str:
    """``GPT 4x4096, 32 heads, 4x2048 bytes`` from the child's size."""
    size = extra.get("size") or {}
    if not size:
        return "GPT"
    return (f"GPT {size['layers']}x{size['width']}, {size['heads']} heads, batch {size['batch']}x{size['seq']} "
            "bytes")


# -- check 0: the interpreter and dtpo's dependencies --------------------------------------------------------------


def parse_requirement(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``("typer", [(">=", "0.29")])`` from ``"typer>=0.29"`` (no markers or extras; they are not used here)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$", text)
    if match is None:
        raise ValueError(f"cannot read the requirement {text!r}")
    name, rest = match.group(1), match.group(2).split(";", 1)[0]
    specs = [(op, version.strip()) for op, version in re.findall(r"(==|>=|<=|!=|~=|>|<)\s*([^,\s]+)", rest)]
    return name, specs


def version_key(version: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.11.0+cu130`` -> ``(2, 11, 0)``), enough to compare releases."""
    release = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(p) for p in release.group(0).split(".")) if release else ()


def satisfies(installed: str, specs: Sequence[tuple[str, str]]) -> bool:
    """Whether ``installed`` meets every ``(operator, version)``, comparing numeric releases."""
    def pad(key: tuple[int, ...], n: int) -> tuple[int, ...]:
        return key + (0,) * (n - len(key))

    have = version_key(installed)
    for op, wanted in specs:
        want = version_key(wanted)
        n = max(len(have), len(want))
        a, b = pad(have, n), pad(want, n)
        ok = {"==": a == b, ">=": a >= b, "<=": a <= b, "!=": a != b, ">": a > b, "<": a < b,
              "~=": a >= b and a[:max(len(want) - 1, 1)] == b[:max(len(want) - 1, 1)]}[op]
        if not ok:
            return False
    return True


def dependency_report(requirements: Sequence[str],
                      version_of: Callable[[str], str | None]) -> tuple[list[str], list[str], list[str]]:
    """``(found, missing, other versions)``: each found one as ``name version``, each other version as
    ``name version (wants SPEC)``."""
    found, missing, other = [], [], []
    for text in requirements:
        name, specs = parse_requirement(text)
        version = version_of(name)
        if version is None:
            missing.append(name)
            continue
        found.append(f"{name} {version}")
        if specs and not satisfies(version, specs):
            other.append(f"{name} {version} (pyproject wants {''.join(op + v for op, v in specs)})")
    return found, missing, other


# -- check 8: the GPU's settings, before and after ----------------------------------------------------------------


def read_settings(nvml: Any, handle: Any) -> dict[str, Any]:
    """The settings this script must leave as they were (``None`` where NVML cannot tell)."""
    def read(fn: str, *args: Any) -> Any:
        try:
            value = getattr(nvml, fn)(handle, *args)
        except Exception:  # noqa: BLE001 - NotSupported, an old pynvml, a fake: unknown
            return None
        return list(value) if isinstance(value, tuple) else value

    graphics, memory = getattr(nvml, "NVML_CLOCK_GRAPHICS", 0), getattr(nvml, "NVML_CLOCK_MEM", 2)
    return {"power limit mW": read("nvmlDeviceGetPowerManagementLimit"),
            "enforced limit mW": read("nvmlDeviceGetEnforcedPowerLimit"),
            "persistence mode": read("nvmlDeviceGetPersistenceMode"),
            "compute mode": read("nvmlDeviceGetComputeMode"),
            "application clock graphics MHz": read("nvmlDeviceGetApplicationsClock", graphics),
            "application clock memory MHz": read("nvmlDeviceGetApplicationsClock", memory)}


def settings_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Each setting that differs, as ``name: before -> after``."""
    return [f"{k}: {before.get(k)} -> {after.get(k)}" for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)]
