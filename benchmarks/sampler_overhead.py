"""Cost of energy measurement: the power sampler's CPU time, and training step time with energy on vs off.

Goals: the background power sampler at 10 Hz costs under 0.5 % of one core, and training with energy
measurement on stays within 1 % of the step time without it (median step-time ratio on/off <= 1.01).

1. Sampler. The devices that discovery picks on this machine (NVML GPUs, RAPL, else the modelled CPU and
   DRAM) are read by the real :class:`dtpo.energy.monitor.Monitor` sampler at 10 Hz while the main thread
   sleeps. The CPU time of the threads the devices and the monitor start (the sampler, and any polling or
   keeper threads of the devices) is read from their per-thread CPU clocks; the whole process's CPU time,
   less that of an idle stretch, is shown as a cross-check, and so is the cost of one snapshot of all devices
   (what the Session adds to a step every ``window_steps`` steps, on the training thread).
2. Training. One process trains the ``mlp`` example workload on the CPU (one torch thread) with a
   ``dtpo.Session`` with energy on (sampler at 10 Hz) and with energy off, alternating short blocks of steps
   with a fresh Session each (the same model and optimizer throughout), so that both see the same machine
   state and the sampler runs only during the blocks measured with energy on. Each step is timed from the
   start of one loop iteration to the start of the next; the first warm-up steps of each block are left out.
   The goal is checked on the median, over rounds, of the ratio of the two blocks' mean step times (means, so
   that the energy window closed every 10 steps counts); its 95 % confidence interval says how finely this
   machine could resolve it. On a shared VM, blocks differ by several percent from one to the next whatever
   is measured, so use many blocks, and read the interval before the verdict.
   The sampler is also run at each of ``--rates`` (default 10, 50 and 100 Hz, ``dtpo train --power-sample-hz``),
   for as long each, and its cost printed per rate (a rate above what a device supports is refused as
   ``--power-sample-hz`` refuses it; see :mod:`dtpo.energy.sample_rate`). ``--sampler-only`` skips part 2.
3. ``--gpu`` (needs an NVIDIA GPU and nvidia-ml-py): a GPU's energy from NVML's total-energy counter and from
   its power polled at 10 Hz and integrated, over the same busy/idle load; the two should agree within 2 %.

Prints a table and exits 1 when a goal is missed (or ``--gpu`` was asked for and could not be measured).

    python benchmarks/sampler_overhead.py [--seconds 10] [--blocks 50] [--steps 23] [--rates 10,50,100]
        [--sampler-only] [--gpu]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import dtpo
from dtpo.core.config import EnergyConfig
from dtpo.core.errors import ConfigError
from dtpo.devices.base import Device, DeviceError
from dtpo.devices.discovery import discover
from dtpo.devices.integrator import PowerIntegrator
from dtpo.energy.monitor import Monitor
from dtpo.workloads.mlp import SyntheticMLP

SAMPLE_HZ = 10.0
RATES_HZ = (10.0, 50.0, 100.0)
SAMPLER_GOAL_PCT = 0.5
STEP_GOAL = 1.01
GPU_GOAL_PCT = 2.0
WARMUP_STEPS = 2  # the Session's default; its energy windows open after these
WINDOW_STEPS = 10  # EnergyConfig's default: one snapshot of every device per 10 steps


# -- 1. the sampler's CPU time ------------------------------------------------------------------------------


def thread_cpu_s(thread: threading.Thread) -> float | None:
    """CPU time (user + system) a live thread has used, or ``None`` where it cannot be read."""
    if thread.ident is not None and hasattr(time, "pthread_getcpuclockid"):
        with contextlib.suppress(OSError, OverflowError):
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    if thread.native_id is not None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


@dataclass
class SamplerCost:
    devices: list[str]
    notes: list[str]
    threads: list[str]
    wall_s: float
    ticks: int
    threads_cpu_s: float | None
    process_cpu_s: float
    idle_process_cpu_s: float  # over an idle stretch as long as the sampler's, scaled from a shorter one
    snapshot_s: float  # one read of every device, on the calling thread (hot)

    @property
    def pct_of_core(self) -> float:
        """The sampling threads' CPU time as a share of one core (the whole process's, less idle, if unreadable)."""
        cpu = self.threads_cpu_s if self.threads_cpu_s is not None else self.process_minus_idle_s
        return 100 * cpu / self.wall_s

    @property
    def process_minus_idle_s(self) -> float:
        return max(self.process_cpu_s - self.idle_process_cpu_s, 0.0)


def measure_sampler(seconds: float, hz: float = SAMPLE_HZ) -> SamplerCost:
    """Run the monitor's sampler over the discovered devices at ``hz`` for ``seconds`` while this thread sleeps.

    Raises:
        ConfigError: ``hz`` is above what a discovered device supports.
    """
    gc.collect()
    idle_s = seconds / 2
    cpu0 = time.process_time()
    time.sleep(idle_s)
    idle_rate = (time.process_time() - cpu0) / idle_s

    before = set(threading.enumerate())
    found = discover(local_rank=0, gpus=True, node_shared=True)
    try:
        monitor = Monitor(found.devices, sample_interval_s=1 / hz)
    except ConfigError:
        for device in found.devices:
            device.close()
        raise
    try:
        threads = [t for t in threading.enumerate() if t not in before]
        start_cpu = [thread_cpu_s(t) for t in threads]
        ticks0, cpu0, t0 = len(monitor.timeline), time.process_time(), time.perf_counter()
        time.sleep(seconds)
        wall, process = time.perf_counter() - t0, time.process_time() - cpu0
        ticks = len(monitor.timeline) - ticks0
        end_cpu = [thread_cpu_s(t) for t in threads]
        n = 200
        t1 = time.perf_counter()
        for _ in range(n):
            monitor.snapshot()
        snapshot = (time.perf_counter() - t1) / n
    finally:
        monitor.close()
    readable = threads and all(c is not None for c in start_cpu + end_cpu)
    threads_cpu = (sum(e - s for s, e in zip(start_cpu, end_cpu, strict=True) if e is not None and s is not None)
                   if readable else None)
    return SamplerCost([d.info.name for d in found.devices], list(found.notes), [t.name for t in threads], wall,
                       ticks, threads_cpu, process, idle_rate * wall, snapshot)


# -- 2. training step time with energy on and off -----------------------------------------------------------


@dataclass
class StepTimes:
    on: list[list[float]] = field(default_factory=list)  # per block, per measured step
    off: list[list[float]] = field(default_factory=list)

    def ratios(self) -> list[float]:
        """Per round: mean step time with energy on over mean step time with energy off."""
        return [statistics.fmean(a) / statistics.fmean(b) for a, b in zip(self.on, self.off, strict=True)]


def median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median (order statistics, normal approximation)."""
    ordered, n = sorted(values), len(values)
    k = int((n - 1.96 * n**0.5) / 2)
    if k < 0 or n < 6:
        return ordered[0], ordered[-1]
    return ordered[k], ordered[n - 1 - k]


def run_block(workload: SyntheticMLP, model: torch.nn.Module, opt: torch.optim.Optimizer, pool: list, energy: bool,
              steps: int, run_dir: Path) -> list[float]:
    """Train ``steps`` steps in a fresh Session; the step times after the warm-up and the first flush.

    Every block trains the same model with the same optimizer, so both arms run on the same memory.
    """
    config = EnergyConfig(sample_interval_s=1 / SAMPLE_HZ) if energy else False
    with contextlib.redirect_stderr(io.StringIO()):  # discovery notes, once per block: shown in part 1 instead
        session = dtpo.Session(device="cpu", energy=config, warmup_steps=WARMUP_STEPS, progress=False,
                               summary=False, run_dir=run_dir, flush_every=10**9)
    model = session.wrap(model)  # one process: the module itself, so the next block can wrap it again
    gc.collect()
    times, last = [], time.perf_counter()
    for x, y in session.batches(itertools.cycle(pool), steps=steps):
        loss = workload.loss(model(x), y)
        session.backward(loss)
        session.step(opt)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    with contextlib.redirect_stderr(io.StringIO()):
        session.finish()
    # Step WARMUP_STEPS opens the energy windows and ends with the Session's first flush of its record.
    return times[WARMUP_STEPS + 1:]


def measure_steps(blocks: int, steps: int, out: Path) -> StepTimes:
    workload = SyntheticMLP()
    data = workload.batches(workload.default_batch_size, rank=0, world_size=1)
    pool = [next(data) for _ in range(8)]
    torch.manual_seed(0)
    model = workload.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=workload.default_lr)
    run_block(workload, model, opt, pool, True, WARMUP_STEPS + 2, out / "warm-on")  # warm up caches, imports
    run_block(workload, model, opt, pool, False, WARMUP_STEPS + 2, out / "warm-off")
    times = StepTimes()
    for r in range(blocks):
        # Alternate which goes first so neither always runs on a freshly idle machine.
        for energy in ((True, False) if r % 2 == 0 else (False, True)):
            block = run_block(workload, model, opt, pool, energy, steps, out / f"{r}-{'on' if energy else 'off'}")
            (times.on if energy else times.off).append(block)
        print(f"\rblock {r + 1}/{blocks}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return times


# -- 3. optional: NVML energy counter vs polled power --------------------------------------------------------


@dataclass
class GpuComparison:
    name: str
    seconds: float
    counter_j: float
    polled_j: float
    polls: int

    @property
    def diff_pct(self) -> float:
        return 100 * abs(self.polled_j - self.counter_j) / self.counter_j if self.counter_j > 0 else float("inf")


def measure_gpu(seconds: float) -> GpuComparison | str:
    """Energy of visible GPU 0 by its counter and by 10 Hz polling over a busy/idle load, or why it cannot be."""
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        from dtpo.devices.nvml import open_nvml_gpus

        gpu: Device = open_nvml_gpus(local_rank=0)[0]  # the GPU CUDA calls cuda:0
    except DeviceError as exc:
        return str(exc)
    if gpu.info.source != "nvml-counter":
        gpu.close()
        return f"{gpu.info.name} has no energy counter to compare polling with"

    def read() -> float:
        watts = gpu.power_w()
        if watts is None:
            raise DeviceError("power not supported")
        return watts

    polled = PowerIntegrator(read, 1 / SAMPLE_HZ, name="gpu-polled")
    try:
        polled.start()
    except DeviceError as exc:
        gpu.close()
        return str(exc)
    a = torch.randn(8192, 8192, device="cuda")
    t0, c0, p0 = time.perf_counter(), gpu.energy_j(), polled.energy_j()
    end = t0 + seconds
    while time.perf_counter() < end:  # 2 s busy, 1 s idle: power steps up and down, as in training with pauses
        busy_until = min(time.perf_counter() + 2.0, end)
        while time.perf_counter() < busy_until:
            a = torch.tanh(a @ a)
            torch.cuda.synchronize()
        time.sleep(max(0.0, min(1.0, end - time.perf_counter())))
    time.sleep(2.0)  # let the power reading settle back to idle within the window
    elapsed, counter, integrated = time.perf_counter() - t0, gpu.energy_j() - c0, polled.energy_j() - p0
    polls = polled.samples
    polled.stop()
    gpu.close()
    return GpuComparison(gpu.info.name, elapsed, counter, integrated, polls)


# -- report --------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long the sampler runs (and the idle baseline, and the --gpu load)")
    parser.add_argument("--blocks", type=int, default=50, help="rounds of one energy-on and one energy-off block")
    parser.add_argument("--steps", type=int, default=23,
                        help=f"steps per block; the first {WARMUP_STEPS + 1} are left out (the default leaves "
                        f"{2 * WINDOW_STEPS}, in which two energy windows close)")
    parser.add_argument("--gpu", action="store_true", help="also compare NVML's energy counter with polled power")
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES_HZ),
                        help="sampler rates (Hz, comma-separated) whose cost is printed, each run --seconds")
    parser.add_argument("--sampler-only", action="store_true", help="measure the sampler only (skip the training)")
    args = parser.parse_args()
    if args.seconds <= 0 or args.blocks < 1 or args.steps < WARMUP_STEPS + 2:
        parser.error(f"--seconds must be > 0, --blocks >= 1 and --steps >= {WARMUP_STEPS + 2}")
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rates must be numbers in Hz, comma-separated, got {args.rates!r}")
    if not rates or not all(0 < r <= 10_000 for r in rates):
        parser.error(f"--rates must be rates above 0 Hz, got {args.rates!r}")
    torch.set_num_threads(1)
    console = Console()

    console.print(f"[bold]1/2[/] power sampler at {SAMPLE_HZ:g} Hz for {args.seconds:g} s "
                  f"(after {args.seconds / 2:g} s idle), then at {', '.join(f'{r:g}' for r in rates)} Hz")
    sampler = measure_sampler(args.seconds)
    console.print(rates_table(rates, args.seconds))
    if args.sampler_only:
        print_sampler_notes(console, sampler)
        return 0 if sampler.pct_of_core < SAMPLER_GOAL_PCT else 1
    console.print(f"[bold]2/2[/] training step time, energy on vs off: {args.blocks} rounds x {args.steps} steps")
    with tempfile.TemporaryDirectory() as out:
        os.environ.setdefault("DTPO_CACHE_DIR", str(Path(out) / "cache"))
        steps = measure_steps(args.blocks, args.steps, Path(out))
    gpu = measure_gpu(args.seconds) if args.gpu else None

    detail = Table(title="training step time (mlp workload, 1 torch thread, fresh Session per block)")
    for col in ("energy", "steps", "median step", "mean step", "median block mean"):
        detail.add_column(col, justify="right")
    medians = {}
    for label, blocks in (("on", steps.on), ("off", steps.off)):
        flat = [t for block in blocks for t in block]
        medians[label] = statistics.median(flat)
        detail.add_row(label, str(len(flat)), f"{medians[label] * 1e3:.3f} ms",
                       f"{statistics.fmean(flat) * 1e3:.3f} ms",
                       f"{statistics.median(statistics.fmean(b) for b in blocks) * 1e3:.3f} ms")
    console.print(detail)

    table = Table(title="cost of energy measurement")
    for col in ("goal", "target", "measured", "verdict"):
        table.add_column(col)
    verdicts, notes = [], []

    pct = sampler.pct_of_core
    ok = pct < SAMPLER_GOAL_PCT
    verdicts.append(ok)
    table.add_row(f"power sampler at {SAMPLE_HZ:g} Hz", f"< {SAMPLER_GOAL_PCT} % of one core",
                  f"{pct:.3f} %", _verdict(ok))
    cpu_s = sampler.threads_cpu_s if sampler.threads_cpu_s is not None else sampler.process_minus_idle_s
    how = (f"CPU clocks of its thread(s) {', '.join(sampler.threads)}" if sampler.threads_cpu_s is not None
           else "whole process less idle (per-thread CPU unreadable)")
    notes.append(f"sampler: {cpu_s * 1e3:.1f} ms CPU over {sampler.wall_s:.1f} s by the {how}; "
                 f"{sampler.ticks} ticks ({sampler.ticks / sampler.wall_s:.1f} Hz), "
                 f"{cpu_s / max(sampler.ticks, 1) * 1e6:.0f} us per tick; whole process less idle: "
                 f"{100 * sampler.process_minus_idle_s / sampler.wall_s:.3f} % of one core")
    notes.append(f"snapshot of all devices: {sampler.snapshot_s * 1e6:.0f} us on the calling thread, once per "
                 f"{WINDOW_STEPS} steps in training")
    notes.append("sampled devices: " + (", ".join(sampler.devices) or "none"))
    notes += [f"  {note}" for note in sampler.notes]

    ratios = steps.ratios()
    ratio = statistics.median(ratios)
    lo, hi = median_ci(ratios)
    ok = ratio <= STEP_GOAL
    verdicts.append(ok)
    table.add_row("step time, energy on / off", f"<= {STEP_GOAL}", f"{ratio:.4f} (95 % CI {lo:.3f}-{hi:.3f})",
                  _verdict(ok))
    notes.append(f"step time: median over {len(ratios)} rounds of the ratio of block mean step times "
                 f"(rounds from {min(ratios):.3f} to {max(ratios):.3f}); ratio of per-step medians "
                 f"{medians['on'] / medians['off']:.4f}")
    accounted = 100 * (sampler.snapshot_s / WINDOW_STEPS / medians["off"]) + sampler.pct_of_core
    notes.append(f"step time, accounted: one snapshot per {WINDOW_STEPS} steps plus all the sampler's CPU taken "
                 f"from the training thread would add {accounted:.3f} % to a {medians['off'] * 1e3:.1f} ms step")

    gpu_goal = "GPU energy, polled vs NVML counter"
    if gpu is None:
        table.add_row(gpu_goal, f"within {GPU_GOAL_PCT:g} %", "not run (pass --gpu)", "-")
    elif isinstance(gpu, str):
        verdicts.append(False)
        table.add_row(gpu_goal, f"within {GPU_GOAL_PCT:g} %", "not measured", "[red]NOT MEASURED[/]")
        notes.append(f"gpu: {gpu}")
    else:
        ok = gpu.diff_pct <= GPU_GOAL_PCT
        verdicts.append(ok)
        table.add_row(gpu_goal, f"within {GPU_GOAL_PCT:g} %", f"{gpu.diff_pct:.2f} %", _verdict(ok))
        notes.append(f"gpu: {gpu.name}: counter {gpu.counter_j:.1f} J, polled {gpu.polled_j:.1f} J "
                     f"from {gpu.polls} polls over {gpu.seconds:.1f} s")
    console.print(table)
    for note in notes:
        console.print(note, highlight=False)
    return 0 if all(verdicts) else 1


def rates_table(rates: list[float], seconds: float) -> Table:
    """The sampler's cost at each rate, each measured for ``seconds`` (a rate a device cannot take: why)."""
    table = Table(title=f"power sampler cost by rate ({seconds:g} s each)")
    for col in ("rate", "ticks/s", "CPU, % of one core", "per tick", "whole process less idle", "devices"):
        table.add_column(col, justify="right")
    for hz in rates:
        try:
            cost = measure_sampler(seconds, hz)
        except ConfigError as exc:
            table.add_row(f"{hz:g} Hz", "-", "refused", "-", "-", str(exc))
            continue
        cpu_s = cost.threads_cpu_s if cost.threads_cpu_s is not None else cost.process_minus_idle_s
        table.add_row(f"{hz:g} Hz", f"{cost.ticks / cost.wall_s:.1f}", f"{cost.pct_of_core:.3f} %",
                      f"{cpu_s / max(cost.ticks, 1) * 1e6:.0f} us",
                      f"{100 * cost.process_minus_idle_s / cost.wall_s:.3f} %", ", ".join(cost.devices) or "none")
    return table


def print_sampler_notes(console: Console, sampler: SamplerCost) -> None:
    """The goal's sampler figure and what it sampled."""
    verdict = _verdict(sampler.pct_of_core < SAMPLER_GOAL_PCT)
    console.print(f"{SAMPLE_HZ:g} Hz sampler: {sampler.pct_of_core:.3f} % of one core (goal < {SAMPLER_GOAL_PCT} %: "
                  f"{verdict}); sampled devices: {', '.join(sampler.devices) or 'none'}")
    for note in sampler.notes:
        console.print(f"  {note}", highlight=False)


def _verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]MISSED[/]"


if __name__ == "__main__":
    sys.exit(main())
