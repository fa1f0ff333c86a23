"""Overhead of ``dtpo launch``'s in-process agent on an unmodified DDP script (goal: step-time ratio
agent/plain <= 1.01), and its step and sample counts against the script's own (they must match exactly).

The same plain DDP script (this file run with ``--workload``: 2 gloo ranks, one thread each, an MLP trained from
a torch ``DataLoader`` with a ``DistributedSampler`` over several epochs, a small evaluation after each; no dtpo
import) is started three ways in every pair, in a random order drawn anew for every pair:

* ``plain``: ``python -m torch.distributed.run --standalone --nproc-per-node 2 SCRIPT`` (the reference),
* ``plain-aa``: the same again (the A/A control: its ratio to the reference is the harness's own noise),
* ``agent``: ``dtpo launch --standalone --nproc-per-node 2 --run-dir DIR SCRIPT`` (the agent measures it).

The script times its own steps the same way in every arm, whatever the agent does: from the request for a
batch to the return of ``optimizer.step()`` (``zero_grad`` included), with ``time.perf_counter`` and
``time.process_time`` (the whole process's CPU time: main, gloo and any agent thread), and writes them per rank
with its own step and sample counts. A run's step time is the mean (``--primary mean``, the default: periodic
work such as energy windows and partial-record flushes included) or the median (``--primary median``) over its
steps after ``--warmup`` of each rank's step times (the two ranks' averaged); its CPU time per step
(``--primary cpu``) is the sum over both ranks of CPU seconds per measured step. The verdict is the median over
pairs of each pair's ratio ``agent/plain`` of the primary metric, beside the same for the A/A control; the
launches differ from each other by more than the steps of one launch do, so the pairs are the unit. When the
A/A control is itself outside +-1 %, the machine was too noisy for a verdict: exit 1 without one.

In every ``agent`` run the record (``DIR/record.json``) must hold, per rank, as many steps as the script took
and the same number of samples (all steps, warm-up ones included).

    python benchmarks/agent_overhead.py [--pairs 6] [--steps 2000] [--warmup 100] [--width 512] [--quick]
    python benchmarks/agent_overhead.py --profile      # one agent run with cProfile in rank 0: the agent's hooks
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.01
NOISE = 0.01  # the A/A control must be within +-1 % for a verdict
ARMS = ("plain", "plain-aa", "agent")
LABELS = {"plain": "torchrun", "plain-aa": "torchrun again (A/A)", "agent": "dtpo launch (agent)"}
PROFILE_ENV = "AGENT_OVERHEAD_PROFILE"  # a file: rank 0 of the workload writes its cProfile stats there
HERE = Path(__file__).resolve()


# -- the workload: a plain DDP script, as a user writes it (no dtpo), that times its own steps ---------------------


def workload(argv: list[str]) -> None:
    """One rank of the plain DDP script (started by torchrun or ``dtpo launch``)."""
    parser = argparse.ArgumentParser(prog="agent_overhead.py --workload")
    parser.add_argument("--steps-per-epoch", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--out", required=True, help="folder for times.<rank>.json")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    size = args.steps_per_epoch * args.batch_size * world
    data = TensorDataset(torch.randn(size, args.width), torch.randint(0, 10, (size,)))
    val = TensorDataset(torch.randn(256, args.width), torch.randint(0, 10, (256,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val, batch_size=128)
    w = args.width
    model = DDP(torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                    torch.nn.Linear(w, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    profile = os.environ.get(PROFILE_ENV) if rank == 0 else None
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    step_s: list[float] = []
    cpu_s: list[float] = []
    steps = samples = 0
    clock, cpu_clock = time.perf_counter, time.process_time
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        batches = iter(loader)
        while True:
            t0, c0 = clock(), cpu_clock()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            c1, t1 = cpu_clock(), clock()
            step_s.append(t1 - t0)
            cpu_s.append(c1 - c0)
            steps += 1
            samples += len(x)
        with torch.no_grad():  # evaluation between epochs: another loader, no optimizer step
            model.eval()
            sum(int((model(x).argmax(1) == y).sum()) for x, y in val_loader)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    Path(args.out, f"times.{rank}.json").write_text(json.dumps(
        {"rank": rank, "steps": steps, "samples": samples, "warmup": args.warmup, "step_s": step_s, "cpu_s": cpu_s}))
    dist.destroy_process_group()


# -- the harness ------------------------------------------------------------------------------------------------


def command(arm: str, run_dir: Path, wargs: list[str]) -> list[str]:
    """The launcher command of one arm (the workload's flags after the script)."""
    script = [str(HERE), "--workload", *wargs]
    if arm == "agent":
        return [sys.executable, "-m", "dtpo", "launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                str(run_dir), *script]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script]


def launch_once(arm: str, folder: Path, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Run the workload once under ``arm``; returns its times per rank, its launch-to-exit seconds and, for the
    agent, its record."""
    out, run_dir = folder / "times", folder / "run"
    out.mkdir(parents=True)
    wargs = ["--steps-per-epoch", str(args.steps_per_epoch), "--epochs", str(args.epochs), "--warmup",
             str(args.warmup), "--width", str(args.width), "--batch-size", str(args.batch_size), "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(command(arm, run_dir, wargs), cwd=folder, env=env, capture_output=True, text=True,
                          check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{arm} run failed with exit code {done.returncode}: {' '.join(command(arm, run_dir, wargs))}")
    ranks = [json.loads(Path(out, f"times.{rank}.json").read_text()) for rank in range(2)]
    record = json.loads(Path(run_dir, "record.json").read_text()) if arm == "agent" else None
    return {"arm": arm, "ranks": ranks, "launch_s": elapsed, "record": record}


def _measured(rk: dict, key: str) -> list[float]:
    return rk[key][rk["warmup"]:]


METRICS = {
    # the run's mean step time over both ranks: what the run takes per step, periodic work (the agent's windows
    # every 10 steps, its record flush every 50) included
    "mean": lambda run: statistics.fmean(statistics.fmean(_measured(rk, "step_s")) for rk in run["ranks"]),
    # the mean over ranks of each rank's median step time: the typical step, blind to work done every k steps
    "median": lambda run: statistics.fmean(statistics.median(_measured(rk, "step_s")) for rk in run["ranks"]),
    # CPU seconds per measured step, both ranks' processes summed
    "cpu": lambda run: sum(statistics.fmean(_measured(rk, "cpu_s")) for rk in run["ranks"]),
}
PRIMARY_HELP = {
    "mean": "the run's mean measured step time (both ranks' means averaged): the time the run takes per step, "
            "periodic work included (the agent's energy windows, every 10 steps, and its partial-record flushes, every "
            "50)",
    "median": "the run's median measured step time (both ranks' medians averaged): the typical step, blind to "
              "work done only every k steps",
    "cpu": "CPU seconds per measured step of both ranks' processes (all their threads)",
}
METRIC_NAMES = {"mean": "mean step", "median": "median step", "cpu": "CPU/step (2 ranks)"}


def count_rows(run: dict) -> list[tuple[int, int, int, int, int, float, float]]:
    """Per rank: rank, the script's steps and samples, the agent's steps and samples (all steps, warm-up ones
    included), the script's and the agent's median measured step time."""
    by_rank = {rk["rank"]: rk for rk in run["record"]["ranks"]}
    rows = []
    for own in run["ranks"]:
        steps = by_rank.get(own["rank"], {"steps": []})["steps"]
        agent_median = statistics.median([s["step_s"] for s in steps[own["warmup"]:]] or [math.nan])
        rows.append((own["rank"], own["steps"], own["samples"], len(steps), sum(s["samples"] for s in steps),
                     statistics.median(own["step_s"][own["warmup"]:]), agent_median))
    return rows


def profile_agent(args: argparse.Namespace, env: dict[str, str]) -> int:
    """One agent run with cProfile in rank 0: where the agent's time goes, per call of its hooks."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="agent-overhead-") as tmp:
        stats_file = Path(tmp, "rank0.prof")
        run = launch_once("agent", Path(tmp, "profile"), args, env | {PROFILE_ENV: str(stats_file)})
        stats = pstats.Stats(str(stats_file))
    steps = run["ranks"][0]["steps"]
    own = statistics.fmean(run["ranks"][0]["step_s"][args.warmup:])
    print(f"cProfile of rank 0, {steps} steps (mean step {own * 1e3:.3f} ms under the profiler); the agent's "
          "functions by cumulative time:")
    rows = []
    for (path, line, name), (_cc, calls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if "/dtpo/" in path:
            rows.append((cumtime, tottime, calls, f"{path.split('/dtpo/')[-1]}:{line}({name})"))
    rows.sort(reverse=True)
    print(f"{'cum us/step':>12} {'own us/step':>12} {'calls/step':>10}  function")
    for cumtime, tottime, calls, where in rows[:args.profile_top]:
        print(f"{cumtime / steps * 1e6:12.1f} {tottime / steps * 1e6:12.1f} {calls / steps:10.2f}  {where}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--workload"]:
        workload(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6, help="pairs (each: plain, plain again, agent; random order)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per rank and run, warm-up included")
    parser.add_argument("--epochs", type=int, default=4, help="epochs the steps are spread over")
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the timings at the start")
    parser.add_argument("--width", type=int, default=512, help="the MLP's width (3 layers)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per step and rank")
    parser.add_argument("--primary", choices=tuple(METRICS), default="mean",
                        help="the metric of the verdict (default: the mean step time, periodic work included)")
    parser.add_argument("--flush-every", type=int, default=None, metavar="N",
                        help="to attribute a cost: the agent writes its partial record every N steps instead of its "
                        "default 50 (a configuration file in DTPO_CONFIG, read by the agent arm only)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the order within pairs")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 pairs of 200 steps")
    parser.add_argument("--profile", action="store_true",
                        help="instead: one agent run with cProfile in rank 0, the agent's functions per step")
    parser.add_argument("--profile-top", type=int, default=30, help="functions --profile lists")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.steps, args.warmup = 2, 200, 20
    args.steps_per_epoch = max(1, args.steps // args.epochs)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.setdefault("DTPO_CACHE_DIR", str(Path(tempfile.gettempdir()) / "dtpo-agent-overhead-cache"))
    scratch = Path(tempfile.mkdtemp(prefix="agent-overhead-config-"))
    agent_env = env
    if args.flush_every is not None:
        from dtpo.core.config import RunConfig

        config = RunConfig().replace(session={"flush_every": args.flush_every}).save(scratch / "config.json")
        agent_env = env | {"DTPO_CONFIG": str(config)}
    try:
        if args.profile:
            return profile_agent(args, agent_env)
        return measure(args, env, agent_env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args: argparse.Namespace, env: dict[str, str], agent_env: dict[str, str]) -> int:
    """The pairs, the tables and the verdict."""

    from rich.console import Console
    from rich.table import Table

    sys.path.insert(0, str(HERE.parent))
    from overhead import describe, median_ci  # the sibling benchmark's statistics (imports torch and dtpo: driver only)

    console = Console(width=max(Console().width, 140))
    order = random.Random(args.seed)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="agent-overhead-") as tmp:
        for pair in range(args.pairs):
            for arm in order.sample(ARMS, len(ARMS)):
                run = launch_once(arm, Path(tmp, f"pair{pair}-{arm}"), args, agent_env if arm == "agent" else env)
                runs[arm].append(run)
                console.print(f"pair {pair + 1}/{args.pairs} {arm:>8}: "
                              + ", ".join(f"{METRIC_NAMES[m]} {METRICS[m](run) * 1e3:.3f} ms" for m in METRICS)
                              + f", {run['launch_s']:.1f} s launch to exit", highlight=False)

    def ratios(arm: str, metric: str) -> list[float]:
        of = METRICS[metric]
        return [of(a) / of(ref) for a, ref in zip(runs[arm], runs["plain"], strict=True)]

    measured = args.steps_per_epoch * args.epochs - args.warmup
    table = Table(title=f"dtpo launch's agent on an unmodified DDP script (2 gloo ranks x 1 thread, MLP width "
                        f"{args.width}, batch {args.batch_size}; {args.pairs} pairs of launches, "
                        f"{measured} measured steps per run after {args.warmup} of warm-up"
                        + (f"; agent's record flushed every {args.flush_every} steps" if args.flush_every else "")
                        + ")")
    table.add_column("arm (runs' medians)", justify="right")
    for metric in METRICS:
        table.add_column(METRIC_NAMES[metric], justify="right")
    for metric in METRICS:
        table.add_column(f"{metric} ratio" + (" [PRIMARY]" if metric == args.primary else ""), justify="right")
    table.add_column("launch→exit", justify="right")
    for arm in ARMS:
        table.add_row(LABELS[arm],
                      *(f"{statistics.median(METRICS[m](r) for r in runs[arm]) * 1e3:.3f} ms" for m in METRICS),
                      *("1" if arm == "plain" else f"{statistics.median(ratios(arm, m)):.4f}" for m in METRICS),
                      f"{statistics.median(r['launch_s'] for r in runs[arm]):.1f} s")
    console.print(table)
    console.print(f"primary metric: {PRIMARY_HELP[args.primary]}; ratios are medians over pairs of each pair's "
                  "ratio (runs of a pair are adjacent in time, in random order)", highlight=False)
    for metric in METRICS:
        console.print(f"{METRIC_NAMES[metric] + ':':<24} A/A {describe(ratios('plain-aa', metric))}", highlight=False)
        console.print(f"{'':<24} agent/plain {describe(ratios('agent', metric))}"
                      + ("  (the verdict)" if metric == args.primary else ""), highlight=False)

    counts = Table(title="steps and samples: the script's own counts against the agent's record (all steps)")
    for col in ("pair", "rank", "script steps", "agent steps", "script samples", "agent samples",
                "median step: script", "median step: agent", "match"):
        counts.add_column(col, justify="right")
    counts_ok = True
    for p, run in enumerate(runs["agent"]):
        for rank, steps, samples, agent_steps, agent_samples, own_s, agent_s in count_rows(run):
            match = steps == agent_steps and samples == agent_samples
            counts_ok &= match
            counts.add_row(str(p + 1), str(rank), str(steps), str(agent_steps), str(samples), str(agent_samples),
                           f"{own_s * 1e3:.3f} ms", f"{agent_s * 1e3:.3f} ms", "yes" if match else "NO")
    console.print(counts)

    ratio, aa = statistics.median(ratios("agent", args.primary)), statistics.median(ratios("plain-aa", args.primary))
    noisy = abs(aa - 1) > NOISE
    met = ratio <= GOAL and not noisy
    console.print(f"{'met' if counts_ok else 'MISSED'}     the agent's steps and samples equal the script's on every "
                  f"rank of {len(runs['agent'])} runs", highlight=False)
    metric = METRIC_NAMES[args.primary]
    if noisy:
        console.print(f"NO VERDICT the A/A control's {metric} ratio is {aa:.4f}, outside 1 +- {NOISE}: the machine "
                      f"was too noisy to tell a 1 % overhead (agent/plain {ratio:.4f}); run again with more --pairs or "
                      "on a quieter machine", highlight=False)
        for name in METRICS:  # a miss larger than the noise still shows: say so, without making it the verdict
            lo, hi = median_ci(ratios("agent", name))
            offset = max(0.0, statistics.median(ratios("plain-aa", name)) - 1)
            if lo > GOAL + offset:
                console.print(f"           even so, on {METRIC_NAMES[name]} agent/plain's 95 % interval of the median "
                              f"({lo:.4f}-{hi:.4f}) lies above {GOAL} by more than that A/A control's offset "
                              f"({offset:+.4f}): an overhead above 1 % shows through the noise", highlight=False)
    else:
        console.print(f"{'met' if met else 'MISSED'}     {metric} ratio agent/plain <= {GOAL} (median over "
                      f"pairs {ratio:.4f}; A/A {aa:.4f})", highlight=False)
    return 0 if met and counts_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
