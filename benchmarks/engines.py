"""torchrun against Ray Train as dtpo's engine: start-up time and steps/s of the same workload and steps on 2 CPU
workers (goal: dtpo on Ray within 5 % of plain Ray Train's steps/s on the same loop).

Four ways to train the same model on the same data for the same steps, each a fresh process started from here:

* ``torchrun``: ``dtpo train --engine torchrun`` (torchrun's elastic launcher, a ``dtpo.Session`` in each worker);
* ``dtpo-ray``: ``dtpo train --engine ray`` (a local Ray instance, Ray Train's ``TorchTrainer``, the same Session);
* ``plain-ray``: plain Ray Train, no dtpo in the loop: a ``TorchTrainer`` whose workers build the same workload's
  model (``ray.train.torch.prepare_model``: DDP), AdamW with the same learning rate, the same batches, and time
  their own steps (the reference);
* ``plain-ray-aa``: the same again (the A/A control: its ratio to ``plain-ray`` is this machine's noise).

A round runs each once; the order rotates from round to round so none has a fixed place. Start-up time is from
the moment the process is started to the start of the first step (rank 0); steps/s is one over the median
duration of rank 0's steps after warm-up, each from the request for its batch to the end of ``zero_grad`` (for dtpo
runs read from the record, for the plain loop timed the same way inside it). The Session's
view of the two dtpo runs (its step time, communication share and energy per sample) is printed beside.

The verdict: the median over rounds of dtpo-ray / plain-ray steps/s must be >= 0.95; the A/A control's median
ratio says how far this machine's noise alone moves that ratio. Exits 1 when the goal is missed.

    python benchmarks/engines.py [--rounds 3] [--steps 150] [--warmup 20] [--workload mlp] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

GOAL = 0.95
VARIANTS = ("torchrun", "dtpo-ray", "plain-ray", "plain-ray-aa")


def plain_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker`` without dtpo: the workload's model, data and loss, timed per step."""
    import ray.train
    import ray.train.torch
    import torch

    from dtpo.workloads import get_workload

    torch.set_num_threads(loop_config["threads"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    workload = get_workload(loop_config["workload"])
    torch.manual_seed(loop_config["seed"])
    model = ray.train.torch.prepare_model(workload.build_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=loop_config["lr"])
    data = workload.batches(loop_config["batch_size"], rank, world, seed=loop_config["seed"])
    starts, ends = [], []
    for _ in range(loop_config["steps"]):
        starts.append(time.time())
        inputs, targets = next(data)
        loss = workload.loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.time())
    if rank == 0:  # this machine's file system: the driver reads it
        Path(loop_config["out"]).write_text(json.dumps({"starts": starts, "ends": ends}))


def run_plain(out: Path, steps: int, workload: str) -> None:
    """The ``plain-ray`` process: a local Ray instance, a TorchTrainer running :func:`plain_loop`."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    import ray
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from dtpo.core.config import RunConfig
    from dtpo.workloads import with_workload_defaults

    config = with_workload_defaults(RunConfig().replace(workload={"name": workload, "steps": steps}))
    workers = config.launch.workers
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    ray.init(address="local", num_cpus=workers * threads, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        trainer = TorchTrainer(plain_loop, train_loop_config={
            "workload": workload, "steps": steps, "seed": config.workload.seed, "lr": config.workload.lr,
            "batch_size": config.workload.batch_size, "threads": threads, "out": str(out)},
            scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": threads}),
            run_config=RayRunConfig(name="plain", storage_path=str(out.parent / "ray-storage")))
        result = trainer.fit()
    finally:
        ray.shutdown()
    if result.error is not None:
        raise SystemExit(f"plain Ray Train failed: {result.error}")


def steps_per_s(starts: list[float], ends: list[float], warmup: int) -> float:
    """One over the median duration of the steps after warm-up (robust to bursts of other work on the machine)."""
    return 1.0 / statistics.median(end - start for start, end in zip(starts[warmup:], ends[warmup:], strict=True))


def run_variant(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start one variant as a fresh process; its start-up time, steps/s and (for dtpo) the Session's figures."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", DTPO_STORE=str(folder / "store.sqlite"))
    run_dir = folder / name
    if name.startswith("plain"):
        command = [sys.executable, __file__, "--plain", str(folder / f"{name}.json"), "--steps", str(args.steps),
                   "--workload", args.workload]
    else:
        command = [sys.executable, "-m", "dtpo", "train", "--engine", name.removeprefix("dtpo-"), "--workload",
                   args.workload, "--workers", "2", "--steps", str(args.steps), "--warmup-steps", str(args.warmup),
                   "--run-dir", str(run_dir), "--no-trace", "--no-report"]
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.time() - started
    if result.returncode != 0:
        raise SystemExit(f"{name} failed ({result.returncode}): {result.stderr[-2000:]}")
    if name.startswith("plain"):
        metrics = json.loads((folder / f"{name}.json").read_text())
        starts, ends = metrics["starts"], metrics["ends"]
        return {"startup_s": starts[0] - started, "steps_per_s": steps_per_s(starts, ends, args.warmup),
                "wall_s": wall}
    record = json.loads((run_dir / "record.json").read_text())
    steps = record["ranks"][0]["steps"]
    starts = [s["started_at"] for s in steps]
    ends = [s["started_at"] + s["step_s"] for s in steps]
    totals = record["totals"]
    per_sample = (record.get("energy") or {}).get("energy_per_sample_j")
    return {"startup_s": starts[0] - started, "steps_per_s": steps_per_s(starts, ends, args.warmup), "wall_s": wall,
            "session_step_ms": 1e3 * _value(totals.get("step_time_s")),
            "session_comm": _value(totals.get("comm_overhead")),
            "session_j_per_sample": _value(per_sample) if per_sample else None,
            "launcher": record["environment"]["launcher"]}


def _value(item: Any) -> float:
    return float(item["value"] if isinstance(item, dict) else item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--workload", default="mlp")
    parser.add_argument("--json", type=Path, default=None, help="Write every run's figures here.")
    parser.add_argument("--plain", type=Path, default=None, help=argparse.SUPPRESS)  # the plain-ray process
    args = parser.parse_args(argv)
    if args.plain is not None:
        run_plain(args.plain, args.steps, args.workload)
        return 0
    console = Console(width=max(Console().width, 110))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="dtpo-engines-") as tmp:
        for index in range(args.rounds):
            order = VARIANTS[index % len(VARIANTS):] + VARIANTS[:index % len(VARIANTS)]
            for name in order:
                folder = Path(tmp) / f"round{index}"
                folder.mkdir(exist_ok=True)
                figures = run_variant(name, folder, args)
                runs[name].append(figures)
                console.print(f"round {index + 1}/{args.rounds} {name:>12}: start-up {figures['startup_s']:6.1f} s, "
                              f"{figures['steps_per_s']:6.2f} steps/s")
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))
    return report(console, runs, args)


def report(console: Console, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> int:
    """Print the table and the verdict; 1 when dtpo on Ray is more than 5 % slower than plain Ray Train."""
    table = Table(title=f"{args.workload}, 2 CPU workers, {args.steps} steps ({args.warmup} warm-up), "
                        f"{args.rounds} rounds: medians")
    for column in ("engine", "start-up s", "steps/s", "vs plain-ray", "Session: step ms", "comm share", "J/sample"):
        table.add_column(column, justify="right")
    plain = statistics.median(r["steps_per_s"] for r in runs["plain-ray"])
    for name in VARIANTS:
        rows = runs[name]
        rate = statistics.median(r["steps_per_s"] for r in rows)
        session = [r for r in rows if "session_step_ms" in r]
        joules = [r["session_j_per_sample"] for r in session if r["session_j_per_sample"] is not None]
        table.add_row(name, f"{statistics.median(r['startup_s'] for r in rows):.1f}", f"{rate:.2f}",
                      f"{rate / plain:.3f}",
                      f"{statistics.median(r['session_step_ms'] for r in session):.1f}" if session else "-",
                      f"{statistics.median(r['session_comm'] for r in session):.1%}" if session else "-",
                      f"{statistics.median(joules):.4f}" if joules else "-")
    console.print(table)
    paired = [d["steps_per_s"] / p["steps_per_s"] for d, p in zip(runs["dtpo-ray"], runs["plain-ray"], strict=True)]
    control = [a["steps_per_s"] / p["steps_per_s"]
               for a, p in zip(runs["plain-ray-aa"], runs["plain-ray"], strict=True)]
    ratio, noise = statistics.median(paired), statistics.median(control)
    met = ratio >= GOAL
    console.print(f"dtpo-ray / plain-ray steps/s, per round: {', '.join(f'{r:.3f}' for r in paired)}; median "
                  f"{ratio:.3f} (goal >= {GOAL}) -> {'met' if met else 'MISSED'}", soft_wrap=True)
    console.print(f"A/A control plain-ray-aa / plain-ray: {', '.join(f'{r:.3f}' for r in control)}; median "
                  f"{noise:.3f} (this machine's noise)", soft_wrap=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
