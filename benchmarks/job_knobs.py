"""Job-knob tuning against untuned training: J/sample, samples/s, the chosen setting and the final loss.

Each workload trains three times per round, interleaved: untuned, tuned (``--tune
precision,grad-accum,compression``), and untuned again (the A/A control: how far two identical runs differ on
this machine). Same global batch, same steps, same seed, same data. Rounds alternate which run goes first.

Goals (exit 1 when one is missed):

* the tuned run's J/sample is at most 0.8x the untuned run's on at least one workload;
* it is never worse on any workload: the ratio is at most 1 + |A/A ratio - 1| (worse than the control's
  spread counts as worse);
* the tuned run's final loss is within 2 % of the untuned run's: the loss of its trained model on the workload's
  fixed evaluation set (the same samples in every run, ``Workload.evaluation_batches``), so it compares what the
  runs learnt rather than the batches each happened to see last. The training loss over the last
  ``--loss-steps`` steps is printed beside it.

On a machine without hardware energy counters, J/sample comes from dtpo's CPU model and is labelled
*estimated*; the ratio of two estimates under the same model is then a ratio of time x modelled power.

Usage: ``python benchmarks/job_knobs.py [--workloads lm,cnn] [--rounds 1] [--steps N] [--cost energy]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_cli import OneLineParser, bad_flag
from rich.console import Console
from rich.table import Table

KNOBS = "precision,grad-accum,compression"
GOAL_RATIO = 0.8
LOSS_TOLERANCE = 0.02


def train(workload: str, run_dir: Path, tuned: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One ``dtpo train`` run; its figures from the record."""
    cmd = [sys.executable, "-m", "dtpo", "train", "--workload", workload, "--workers", str(args.workers),
           "--run-dir", str(run_dir), "--overwrite"]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if tuned:
        cmd += ["--tune", KNOBS, "--cost", args.cost]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"dtpo train {workload} ({'tuned' if tuned else 'untuned'}) failed: {' | '.join(tail)}")
    record = json.loads((run_dir / "record.json").read_text())
    energy = record["energy"]["energy_per_sample_j"]
    steps_by_rank = [[s for s in r["steps"] if not s["warmup"] and s.get("loss") is not None]
                     for r in record["ranks"]]
    last = [statistics.fmean(s["loss"] for s in steps[-args.loss_steps:]) for steps in steps_by_rank if steps]
    tuning = next((r.get("tuning") for r in record["ranks"] if r.get("tuning")), None) or {}
    choice = tuning.get("choice")
    label = "untuned" if not tuned else (
        f"{choice['precision']}, accum {choice['grad_accum']}, "
        + (f"powersgd-{choice['powersgd_rank']}" if choice["compression"] == "powersgd" else choice["compression"])
        if choice else "still profiling")
    evaluation = record["ranks"][0].get("evaluation")
    if not evaluation:
        raise RuntimeError(f"dtpo train {workload}: the record holds no evaluation loss")
    return {"j_per_sample": energy["value"], "estimated": energy["source"] == "estimated",
            "samples_per_s": record["totals"]["throughput"]["value"], "train_loss": statistics.fmean(last),
            "final_loss": evaluation["loss"],
            "setting": label, "wall_s": time.perf_counter() - started,
            "profiling_steps": tuning.get("profiling_steps")}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="job_knobs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="lm,cnn")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: each workload's own)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cost", default="energy")
    parser.add_argument("--loss-steps", type=int, default=20, help="steps the printed training loss is averaged over")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads:
        bad_flag(parser.prog, "--workloads names no workload")
    if args.rounds < 1 or args.workers < 2 or (args.steps is not None and args.steps < 20) or args.loss_steps < 1:
        bad_flag(parser.prog, "--rounds and --loss-steps must be >= 1, --workers >= 2, --steps >= 20")
    console = Console(width=200)
    with tempfile.TemporaryDirectory(prefix="dtpo-job-knobs-") as tmp:
        root = Path(args.out or tmp)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {"untuned": [], "tuned": [], "A/A": []}
                                                             for w in workloads}
        for rnd in range(args.rounds):
            for workload in workloads:
                order = ["untuned", "tuned", "A/A"] if rnd % 2 == 0 else ["tuned", "untuned", "A/A"]
                for kind in order:
                    console.print(f"round {rnd + 1}/{args.rounds}: {workload} {kind} ...")
                    result = train(workload, root / f"{workload}-{kind.replace('/', '')}-{rnd}", kind == "tuned", args)
                    runs[workload][kind].append(result)
        return report(console, runs, args)


def report(console: Console, runs: dict[str, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> int:
    """Print the table and the goals; 0 when every goal is met."""
    estimated = any(r["estimated"] for w in runs.values() for rs in w.values() for r in rs)
    unit = "J/sample (estimated)" if estimated else "J/sample"
    table = Table(title=f"job-knob tuning (--tune {KNOBS} --cost {args.cost}) against untuned, {args.workers} "
                        f"workers, {args.rounds} round(s), medians")
    for name in ("workload", "run", unit, "samples/s", "ratio J/sample", "final loss (evaluation)",
                 f"train loss (last {args.loss_steps})", "setting"):
        table.add_column(name, justify="left" if name in ("workload", "run", "setting") else "right")
    verdicts: dict[str, dict[str, float]] = {}
    for workload, kinds in runs.items():
        med = {k: {f: statistics.median(r[f] for r in rs)
                   for f in ("j_per_sample", "samples_per_s", "final_loss", "train_loss")}
               for k, rs in kinds.items()}
        base = med["untuned"]["j_per_sample"]
        for kind in ("untuned", "tuned", "A/A"):
            m = med[kind]
            settings = sorted({r["setting"] for r in kinds[kind]})
            table.add_row(workload, kind, f"{m['j_per_sample']:.4g}", f"{m['samples_per_s']:.1f}",
                          f"{m['j_per_sample'] / base:.3f}", f"{m['final_loss']:.4f}", f"{m['train_loss']:.4f}",
                          "; ".join(settings))
        verdicts[workload] = {"ratio": med["tuned"]["j_per_sample"] / base,
                              "aa": med["A/A"]["j_per_sample"] / base,
                              "loss": abs(med["tuned"]["final_loss"] / med["untuned"]["final_loss"] - 1)}
    console.print(table)
    if estimated:
        console.print("J/sample is estimated (dtpo's CPU power model: no RAPL or NVML counter on this machine).")
    goals = []
    best = min(verdicts, key=lambda w: verdicts[w]["ratio"])
    goals.append((f"tuned J/sample <= {GOAL_RATIO}x untuned on at least one workload "
                  f"(best: {best} {verdicts[best]['ratio']:.3f})", verdicts[best]["ratio"] <= GOAL_RATIO))
    for workload, v in verdicts.items():
        allowed = 1 + abs(v["aa"] - 1)
        goals.append((f"{workload}: tuned not worse than untuned ({v['ratio']:.3f} <= {allowed:.3f}, "
                      f"1 + the A/A spread)", v["ratio"] <= allowed))
        goals.append((f"{workload}: final loss within {LOSS_TOLERANCE * 100:g} % of untuned ({v['loss'] * 100:.2f} %)",
                      v["loss"] <= LOSS_TOLERANCE))
    for text, ok in goals:
        console.print(f"{'met   ' if ok else 'MISSED'}  {text}")
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
