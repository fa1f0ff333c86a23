"""Overhead of dtpo.Session over a plain loop: its own CPU time per step, counted, and the paired wall ratio.

First, the Session's bookkeeping, read from its own counter (:mod:`dtpo.session.loop.bookkeeping`: the thread's CPU time
inside the Session's code on the measured steps it counts, the user's work left out; here one step in four, where a
Session counts one in 16), in one process on small models (less the counter's own share of each stretch, which it times
in place as a profiler calibrates itself; the raw figure beside it): Linear(8, 4) (2 parameter tensors, little work
between the Session's calls) and ``--deep-layers`` Linear(8, 8) (many tensors), both judged against at most 30 us per
step plus 0.5 us per parameter tensor, on the mean over every counted step of blocks of steps (window ends and flushes
included); and a diagnostic, 2 x Linear(512, 512) (4 tensors, about as much work between the calls as the many-tensor
model), not judged, which shows how much of a cost comes from the work between the calls (caches and predictors gone
cold) rather than from the tensors (one process has no DDP: the gradient-ready stamp DDP runs, on one parameter tensor
once it learned which comes last, is in the wall ratio below, not in the counter). Next to them the mean over the whole
run (what the record keeps) and, for context, the difference of the process CPU time of the Session loop and a plain
loop in paired blocks (the old measure).

Then the paired wall ratio, ``--runs`` times, each with fresh processes: two gloo ranks train three copies of the
same model on the same data: a plain DDP loop (the reference), a second plain DDP loop (the A/A control: its ratio
to the reference is the harness's noise and bias, whatever dtpo does), and a dtpo Session. The three take turns
step by step, in a random order drawn anew for every step (the same on both ranks), so all three see the same
machine state and none has a fixed place in the sequence; a round is ``--block`` steps of each. Each step is timed
from the request for its batch to the end of its optimizer step (``zero_grad`` included), and its CPU time is read
with ``resource.getrusage`` (the whole process: main, collective and sampler threads). A run's ratio is the ratio
of totals, dtpo's steps over the plain loop's (the mean step time's ratio: every turn gives each loop one step, so
the machine's drift cancels), with a 95 % bootstrap confidence interval over rounds, in wall time (rank 0's: both
ranks leave each step's all-reduce together) and in CPU time (both ranks summed), each next to the A/A control's.
On a small shared machine a step's wall time varies by 15-20 % from one step to the next (two ranks contend for
the cores and each step waits for the slower one) and its CPU time not much less, so rounds of the same loops give
A/A ratios off by one to three percent at 60 rounds; at the default 240 (about two minutes a run here) the A/A
ratio came within 0.2 % of 1 in the runs measured (its interval about +-0.8 %), so the verdict is the Session's
cost rather than the noise. Goal, in every
run: the CPU-time ratio at most 1.01 (all the extra work dtpo does, whichever thread does it), and the wall ratio
not significantly above 1.01 (its confidence interval reaches 1.01: dtpo adds no wait the CPU time cannot see).
Both ratios, their intervals and the A/A control's are printed for every run.

Exits 1 when any goal is missed.

    python benchmarks/overhead.py [--runs 5] [--rounds 240] [--block 8] [--width 1024] [--no-energy]
                                  [--compression none] [--bookkeeping-only]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import dtpo
from dtpo.session.loop.bookkeeping import BookkeepingCounter

GOAL = 1.01
BOOKKEEPING_GOAL_US = 30.0  # per step
BOOKKEEPING_GOAL_PER_TENSOR_US = 0.5  # per parameter tensor
LOOPS = ("plain", "plain-aa", "dtpo")
BOOKKEEPING_SAMPLE_ONE_IN = 4  # the counter's sampling in the one-process measurement (the Session's default: 16)


def make_model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def batches(width: int, rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    pool = [(torch.randn(64, width, generator=gen), torch.randint(0, 10, (64,), generator=gen)) for _ in range(8)]
    i = 0
    while True:
        yield pool[i % len(pool)]
        i += 1


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def plain_step(width: int, rank: int) -> Callable[[], None]:
    """One step of the plain DDP loop, as a user writes it."""
    model = DistributedDataParallel(make_model(width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = batches(width, rank)

    def step() -> None:
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def dtpo_step(width: int, rank: int, session: dtpo.Session) -> Callable[[], None]:
    """One step of the same loop through a Session (the generator resumes where the last step left it)."""
    model = session.wrap(make_model(width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stream = iter(session.batches(batches(width, rank)))

    def step() -> None:
        x, y = next(stream)
        loss = F.cross_entropy(model(x), y)
        session.backward(loss)
        session.step(opt)

    return step


def _energy(args: argparse.Namespace) -> bool | dtpo.EnergyConfig:
    """The Session's energy setting: off, or on with the power timeline sampled every ``--sample-interval``."""
    if not args.energy:
        return False
    return dtpo.EnergyConfig(sample_interval_s=args.sample_interval if args.sample_interval > 0 else None)


# the bookkeeping's models: (name, layers, width, judged): few and many parameter tensors against the goal, and a
# diagnostic with few tensors but as much work between the Session's calls as the many-tensor one
BOOKKEEPING_MODELS = (("Linear(8, 4)", 1, 8, True), ("{n} x Linear(8, 8)", 0, 8, True),
                      ("2 x Linear(512, 512)", 2, 512, False))


def small_model(layers: int, width: int) -> nn.Module:
    """One Linear(8, 4) for ``layers == 1``, else ``layers`` Linear(width, width)."""
    torch.manual_seed(0)
    if layers <= 1:
        return nn.Linear(8, 4)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])


def bookkeeping_of(layers: int, width: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """The Session's counter over blocks of steps of a small model, in paired blocks with the same plain loop."""
    session = dtpo.Session(progress=False, summary=False, run_dir=run_dir, flush_every=10**9,
                           energy=_energy(args), count_flops=False)
    # one step in four counted (and one calibrating) rather than the default one in 16: a tighter interval from the
    # same steps; the counter's own share is taken off either way
    session.bookkeeping = BookkeepingCounter(sample_one_in=BOOKKEEPING_SAMPLE_ONE_IN)
    model = session.wrap(small_model(layers, width))
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64 if layers > 1 else 4, width), torch.randint(0, 4, (64 if layers > 1 else 4,))
    stream = iter(session.batches(itertools.repeat((x, y))))
    plain = small_model(layers, width)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.01)
    counter = session.bookkeeping

    def plain_block(n: int) -> float:
        c0 = cpu_seconds()
        for _ in range(n):
            F.cross_entropy(plain(x), y).backward()
            plain_opt.step()
            plain_opt.zero_grad(set_to_none=True)
        return (cpu_seconds() - c0) / n

    def dtpo_block(n: int) -> tuple[tuple[float, float, int], float]:
        ns0, steps0, stretches0, c0 = counter.total_ns, counter.steps, counter.stretches, cpu_seconds()
        for _ in range(n):
            bx, by = next(stream)
            session.backward(F.cross_entropy(model(bx), by))
            session.step(opt)
        cpu = (cpu_seconds() - c0) / n
        bias = (counter.stretches - stretches0) * counter.empty_stretch_ns  # the counter's own reads, by place
        return (counter.total_ns - ns0, bias, counter.steps - steps0), cpu

    plain_block(args.block_steps), dtpo_block(args.block_steps)  # the warm-up steps, then counting starts over
    blocks, extra, base = [], [], []
    for _ in range(args.blocks):
        p = plain_block(args.block_steps)
        counted, d = dtpo_block(args.block_steps)
        blocks.append(counted)
        extra.append(d - p)
        base.append(p)
    session.finish()
    return {"tensors": tensors, "blocks": blocks, "mean": counter.seconds_per_step, "extra": extra, "plain": base}


def pooled_per_step(blocks: list[tuple[float, float, int]], seed: int = 0,
                    resamples: int = 2000) -> tuple[float, float, float, float]:
    """The mean per counted step over all blocks (each ``(raw ns, counter's own ns, counted steps)``), less the
    counter's own share, with a 95 % bootstrap interval over blocks; and the raw mean.

    The mean of every counted step, not a median of blocks: the rare steps that close a window or flush the record
    fall unevenly into blocks, so a median of blocks' means would leave part of their cost out.

    Returns:
        The mean, the interval's ends, and the raw mean, in seconds.
    """
    def net(picked: list[tuple[float, float, int]]) -> float:
        return sum(r - b for r, b, _ in picked) / max(sum(n for _, _, n in picked), 1) / 1e9

    rng = random.Random(seed)
    resampled = sorted(net([rng.choice(blocks) for _ in blocks]) for _ in range(resamples))
    raw = sum(r for r, _, _ in blocks) / max(sum(n for _, _, n in blocks), 1) / 1e9
    return net(blocks), resampled[int(0.025 * resamples)], resampled[int(0.975 * resamples) - 1], raw


def bookkeeping(rank: int, args: argparse.Namespace, out: str) -> None:
    """One process, the small models: the Session's counted bookkeeping per step."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    results = []
    for i, (name, layers, width, judged) in enumerate(BOOKKEEPING_MODELS):
        layers = layers or args.deep_layers
        result = bookkeeping_of(layers, width, args, Path(out) / f"single-{i}")
        results.append({"model": name.format(n=layers), "judged": judged, **result})
    Path(out, "bookkeeping.json").write_text(json.dumps(results))


def interleaved_rounds(steps: dict[str, Callable[[], None]], rounds: int, block: int, rank: int,
                       progress: bool = True) -> tuple[dict[str, list[list[float]]], dict[str, list[float]]]:
    """Run the loops in ``steps`` in turns, one step each in a random order drawn anew every time (the same
    sequence on every rank), ``block`` turns per round, after one block of warm-up (DDP rebuilds its buckets, a
    Session passes its warm-up steps).

    Returns:
        ``wall[name][round]``: that round's step times; ``cpu[name][round]``: that round's CPU seconds.
    """
    names = tuple(steps)
    order = random.Random(1234)
    for _ in range(block):
        for name in names:
            steps[name]()
    wall: dict[str, list[list[float]]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names:
            wall[name].append([])
            cpu[name].append(0.0)
        for _ in range(block):
            for name in order.sample(names, len(names)):
                c0, t0 = cpu_seconds(), time.perf_counter()
                steps[name]()
                t1, c1 = time.perf_counter(), cpu_seconds()
                wall[name][-1].append(t1 - t0)
                cpu[name][-1] += c1 - c0
        if progress and rank == 0 and (r + 1) % 10 == 0:
            print(f"round {r + 1}/{rounds}", flush=True)
    return wall, cpu


def join_world(rank: int, world: int, out: str) -> None:
    """Make this process rank ``rank`` of a gloo world of ``world``, meeting the others in a file under ``out`` (not
    on a port picked beforehand, which another process could take before the store binds it)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)


def leave_world(steps: dict[str, Callable[[], None]]) -> None:
    """Drop the loops (their DDP models and pending work) before the process group and the interpreter go: torn
    down while Python finalises, gloo's threads can abort the process (see :mod:`dtpo.distributed.worker_exit`), as
    4 runs of this benchmark did."""
    steps.clear()
    gc.collect()
    dist.barrier()  # no rank tears its group down while another is still in the last collective
    dist.destroy_process_group()


def worker(rank: int, world: int, args: argparse.Namespace, out: str) -> None:
    join_world(rank, world, out)
    session = dtpo.Session(progress=False, summary=False, run_dir=Path(out) / "run", flush_every=10**9,
                           energy=_energy(args), compression=args.compression)
    steps = {"plain": plain_step(args.width, rank), "plain-aa": plain_step(args.width, rank),
             "dtpo": dtpo_step(args.width, rank, session)}
    wall, cpu = interleaved_rounds(steps, args.rounds, args.block, rank, progress=False)
    session.finish()
    everyone: list[dict | None] = [None] * world
    dist.all_gather_object(everyone, {"wall": wall, "cpu": cpu, "counted": session.bookkeeping.seconds_per_step})
    if rank == 0:
        Path(out, "times.json").write_text(json.dumps(everyone))
    del session  # it holds the wrapped model too
    leave_world(steps)


def median_ci(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95 % confidence interval of the median (binomial order statistics)."""
    s, n = sorted(values), len(values)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return s[lo], s[hi]


def describe(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    lo, hi = median_ci(ratios)
    return f"{statistics.median(ratios):.4f} (quartiles {q[0]:.4f}-{q[2]:.4f}, 95% CI of median {lo:.4f}-{hi:.4f})"


def bookkeeping_table(args: argparse.Namespace, results: list[dict[str, Any]]) -> tuple[Table, bool]:
    """The counted bookkeeping of each small model against 30 us + 0.5 us per parameter tensor; whether every judged
    model met it (the diagnostic one, with few tensors but much work, only shows where a cost comes from)."""
    table = Table(title=f"dtpo.Session bookkeeping: its own CPU time per step, counted (one process, energy "
                        f"{'on' if args.energy else 'off'}; {args.blocks} blocks of {args.block_steps} steps)")
    for col in ("model", "parameter tensors", "plain step (CPU)", "counted per step: mean over the blocks (95% CI)",
                "raw: the counter's reads in", "per tensor", "mean over the run", "goal", "verdict",
                "process CPU, dtpo - plain (context)"):
        table.add_column(col, justify="right")
    met = True
    for result in results:
        mean, lo, hi, raw = (v * 1e6 for v in pooled_per_step(result["blocks"]))
        goal = BOOKKEEPING_GOAL_US + BOOKKEEPING_GOAL_PER_TENSOR_US * result["tensors"]
        verdict = "met" if mean <= goal else "MISSED"
        if result["judged"]:
            met = met and mean <= goal
        else:
            verdict = f"({'under' if mean <= goal else 'over'}: diagnostic)"
        table.add_row(result["model"], str(result["tensors"]), f"{statistics.median(result['plain']) * 1e6:.0f} us",
                      f"{mean:.1f} us ({lo:.1f}-{hi:.1f})", f"{raw:.1f} us", f"{mean / result['tensors']:.2f} us",
                      f"{result['mean'] * 1e6:.1f} us", f"<= {goal:.1f} us", verdict,
                      f"{statistics.median(result['extra']) * 1e6:.1f} us")
    return table, met


def wall_run(args: argparse.Namespace, console: Console | None = None) -> list[dict[str, Any]]:
    """One paired run of the three loops on two gloo ranks, in fresh processes: each rank's times.

    A run whose worker process aborted (gloo's threads can abort a 2-rank process, "terminate called without an
    active exception", about once in a few hundred runs here: see :mod:`dtpo.distributed.worker_exit`) left no
    times; it is run again once, and the output says so."""
    for attempt in (1, 2):
        with tempfile.TemporaryDirectory() as out:
            os.environ["DTPO_CACHE_DIR"] = str(Path(out) / "cache")
            try:
                mp.spawn(worker, args=(2, args, out), nprocs=2, join=True)
            except mp.ProcessExitedException as exc:
                if attempt == 2 or exc.signal_name != "SIGABRT":
                    raise
                if console is not None:
                    console.print(f"a worker died ({exc}); this run starts again in fresh processes")
                continue
            return json.loads(Path(out, "times.json").read_text())
    raise AssertionError("unreachable")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="paired wall-ratio runs, each with fresh processes")
    parser.add_argument("--rounds", type=int, default=240, help="rounds per run")
    parser.add_argument("--block", type=int, default=8, help="steps of each loop per round")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-energy", dest="energy", action="store_false",
                        help="measure the Session without energy measurement (to attribute an overhead)")
    parser.add_argument("--compression", default="none", help="the Session's gradient compression")
    parser.add_argument("--sample-interval", type=float, default=0.1,
                        help="seconds between power-timeline samples (0: no sampler thread), to attribute a cost")
    parser.add_argument("--deep-layers", type=int, default=32,
                        help="Linear layers of the bookkeeping's model with many parameter tensors")
    parser.add_argument("--blocks", type=int, default=30, help="blocks of steps for the bookkeeping")
    parser.add_argument("--block-steps", type=int, default=100, help="steps per bookkeeping block")
    parser.add_argument("--bookkeeping-only", action="store_true",
                        help="only measure the Session's per-step bookkeeping in one process")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 120))
    with tempfile.TemporaryDirectory() as out:
        os.environ["DTPO_CACHE_DIR"] = str(Path(out) / "cache")
        mp.spawn(bookkeeping, args=(args, out), nprocs=1, join=True)
        results = json.loads(Path(out, "bookkeeping.json").read_text())
    table, counted_met = bookkeeping_table(args, results)
    console.print(table)
    if args.bookkeeping_only:
        return 0 if counted_met else 1

    table = Table(title=f"dtpo.Session over plain DDP, paired ratios of totals (2 gloo ranks, {args.runs} runs of "
                        f"{args.rounds} rounds x {args.block} steps, width {args.width}, compression "
                        f"{args.compression}, energy {'on' if args.energy else 'off'}; 95% bootstrap CI)")
    for col in ("run", "median step plain (rank 0)", "wall A/A plain/plain", "wall dtpo/plain", "CPU A/A plain/plain",
                "CPU dtpo/plain", "counted per step (ranks)", "verdict"):
        table.add_column(col, justify="right")
    walls, cpus, walls_aa, cpus_aa, verdicts = [], [], [], [], []
    for run in range(args.runs):
        ranks = wall_run(args, console)
        wall = ranks[0]["wall"]  # both ranks leave each step's all-reduce together: rank 0's times are the step's
        wall_rounds = {name: [sum(steps) for steps in wall[name]] for name in LOOPS}
        cpu_rounds = {name: [sum(rk["cpu"][name][r] for rk in ranks) for r in range(len(wall["plain"]))]
                      for name in LOOPS}
        ours, aa = total_ratio(wall_rounds, "dtpo", run), total_ratio(wall_rounds, "plain-aa", run)
        ours_cpu, aa_cpu = total_ratio(cpu_rounds, "dtpo", run), total_ratio(cpu_rounds, "plain-aa", run)
        walls.append(ours[0])
        cpus.append(ours_cpu[0])
        walls_aa.append(aa[0])
        cpus_aa.append(aa_cpu[0])
        verdict = judge(ours, ours_cpu)
        verdicts.append(verdict)
        plain_steps = [t for block in wall["plain"] for t in block]
        counted = ", ".join(f"{rk['counted'] * 1e6:.1f}" if rk["counted"] else "-" for rk in ranks)
        table.add_row(str(run + 1), f"{statistics.median(plain_steps) * 1e3:.2f} ms", ci_text(aa), ci_text(ours),
                      ci_text(aa_cpu), ci_text(ours_cpu), f"{counted} us", verdict)
        console.print(f"run {run + 1}/{args.runs}: dtpo/plain wall {ours[0]:.4f}, CPU {ours_cpu[0]:.4f}; "
                      f"A/A wall {aa[0]:.4f}, CPU {aa_cpu[0]:.4f}")
    console.print(table)
    wall_met = all(v == "met" for v in verdicts)
    console.print(f"dtpo/plain, all {args.runs} runs: wall {', '.join(f'{r:.4f}' for r in walls)}; "
                  f"CPU {', '.join(f'{r:.4f}' for r in cpus)}")
    console.print(f"A/A control plain/plain, all {args.runs} runs: wall {', '.join(f'{r:.4f}' for r in walls_aa)}; "
                  f"CPU {', '.join(f'{r:.4f}' for r in cpus_aa)}")
    console.print(f"goal in every run (CPU ratio <= {GOAL}, wall ratio not significantly above {GOAL}): "
                  f"{'met' if wall_met else 'MISSED'}")
    console.print(f"counted bookkeeping goal (<= {BOOKKEEPING_GOAL_US:g} us per step + "
                  f"{BOOKKEEPING_GOAL_PER_TENSOR_US:g} us per parameter tensor): "
                  f"{'met' if counted_met else 'MISSED'}")
    return 0 if wall_met and counted_met else 1


def total_ratio(rounds: dict[str, list[float]], name: str, seed: int = 0,
                resamples: int = 2000) -> tuple[float, float, float]:
    """Loop ``name``'s total over the plain loop's (each round's total time of each loop), with a 95 % bootstrap
    confidence interval that resamples rounds (a round's steps of every loop stay together: they are paired).

    Returns:
        The ratio, and the interval's low and high ends.
    """
    ours, plain = rounds[name], rounds["plain"]
    n = len(ours)
    rng = random.Random(seed)
    resampled = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        resampled.append(sum(ours[i] for i in picks) / sum(plain[i] for i in picks))
    resampled.sort()
    return sum(ours) / sum(plain), resampled[int(0.025 * resamples)], resampled[int(0.975 * resamples) - 1]


def judge(wall: tuple[float, float, float], cpu: tuple[float, float, float]) -> str:
    """A run's verdict: the CPU-time ratio at most the goal, and the wall ratio not significantly above it."""
    if cpu[0] > GOAL:
        return "MISSED (CPU)"
    if wall[1] > GOAL:
        return "MISSED (wall)"
    return "met"


def ci_text(ratio: tuple[float, float, float]) -> str:
    """A ratio with its 95 % confidence interval."""
    return f"{ratio[0]:.4f} ({ratio[1]:.4f}-{ratio[2]:.4f})"


if __name__ == "__main__":
    sys.exit(main())
