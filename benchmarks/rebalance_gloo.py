"""The real-rank part of the rebalance benchmark: ``dtpo train`` on two gloo ranks, one of them slowed for good.

Two CPU ranks train the built-in ``lm`` (a small transformer: compute is most of its step, as on a GPU) on two
virtual A40s (:mod:`dtpo.devices.virtual_nvml`, made with slow
steps) whose GPU 1 is slowed ``factor`` times (``dtpo virtual-gpus fault --slow``): rank 1 then waits inside each
step's compute as long as a GPU that much slower would take, a labelled delay, so its step times are partly
simulated while everything else (gloo, DDP, the shares, the loss) is real. Each round runs three modes back to
back, in an order that rotates from round to round, all with the round's seed:

* *none*: no tuning (each rank draws its own stream of batches);
* *even*: ``--tune rebalance --rebalance-max-share 1``: the rebalanced runs' data path (every rank draws the global
  batch and takes its share) with shares that cannot move, i.e. the even run on the same global batches;
* *rebalance*: ``--tune rebalance``.

What is compared, per run: throughput (samples per second over the measured steps, from ``record.json``) and the
trained model's loss on the workload's fixed evaluation set (the same 1,024 samples in every run). The untuned runs
of the first two rounds (seeds 0 and 1) make the A/A control of throughput, and their losses the seed-to-seed
spread.

Goals: rebalanced throughput above the untuned one by more than the A/A difference; the rebalanced model's
evaluation loss equal to the even run's on the same global batches (the same update, to float rounding) within a
tenth of the seed-to-seed spread, in every round.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtpo.devices.virtual_nvml import ENV
from dtpo.devices.virtual_nvml.make import create, inject

MODES = ("none", "even", "rebalance")
LOSS_SHARE_OF_SPREAD = 0.1  # the rebalanced model's loss within this share of the seed-to-seed spread of the even


@dataclass(frozen=True)
class RealRun:
    """One ``dtpo train`` run on the two gloo ranks."""

    mode: str
    seed: int
    throughput: float  # samples/s over the measured steps (partly simulated: the slowed rank's delay)
    eval_loss: float
    final_shares: list[int] | None
    changes: int


@dataclass(frozen=True)
class RealResult:
    """The paired runs and what they show."""

    runs: list[RealRun]
    factor: float
    steps: int
    workload: str = "lm"

    def of(self, mode: str) -> list[RealRun]:
        """The runs of one mode, in order."""
        return [r for r in self.runs if r.mode == mode]

    @property
    def speedup(self) -> float:
        """Mean rebalanced throughput over mean untuned throughput."""
        return statistics.fmean(r.throughput for r in self.of("rebalance")) / statistics.fmean(
            r.throughput for r in self.of("none"))

    @property
    def aa(self) -> float:
        """The A/A control: the first two untuned runs' throughput ratio, minus one, in absolute value."""
        none = self.of("none")
        return abs(none[1].throughput / none[0].throughput - 1.0) if len(none) > 1 else float("nan")

    @property
    def seed_spread(self) -> float:
        """How far the untuned runs' evaluation losses lie apart across seeds."""
        losses = [r.eval_loss for r in self.of("none")]
        return max(losses) - min(losses)

    @property
    def loss_gap(self) -> float:
        """The largest difference, over seeds, between the rebalanced and the even run's evaluation loss."""
        even = {r.seed: r.eval_loss for r in self.of("even")}
        return max(abs(r.eval_loss - even[r.seed]) for r in self.of("rebalance"))

    def goals(self) -> list[tuple[str, bool, str]]:
        """``(goal, met, figure)`` for the real-rank goals."""
        allowed = LOSS_SHARE_OF_SPREAD * self.seed_spread
        return [
            ("real 2 ranks: rebalance faster than no tuning by more than the A/A difference",
             self.speedup - 1.0 > self.aa, f"x{self.speedup:.3f} vs A/A {self.aa:.3f}"),
            ("real 2 ranks: the rebalanced model's evaluation loss that of the even run on the same batches",
             self.loss_gap <= allowed,
             f"largest difference {self.loss_gap:.5f}, allowed {allowed:.5f} (a tenth of the seed spread "
             f"{self.seed_spread:.4f})"),
        ]


def run_real(rounds: int = 2, factor: float = 2.0, steps: int = 80, workload: str = "lm",
             progress: Callable[[str], None] | None = None) -> RealResult:
    """Run ``rounds`` rounds of :data:`MODES` (rotating order, seed = round index) on two virtual A40s with GPU 1
    slowed ``factor`` times.

    Raises:
        RuntimeError: A run failed (its last output lines in the message).
    """
    runs: list[RealRun] = []
    with tempfile.TemporaryDirectory(prefix="dtpo-rebalance-real-") as tmp:
        folder = Path(tmp)
        gpus = create(folder / "gpus", "A40", 2, "resnet50", slow_steps=True)
        inject(gpus.directory, 1, slow_factor=factor)
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env |= {ENV: str(gpus.directory), "DTPO_STATE_DIR": str(folder / "state"), "DTPO_RUN_ROOT": str(folder)}
        for pair in range(rounds):
            order = MODES[pair % len(MODES):] + MODES[:pair % len(MODES)]
            for mode in order:
                if progress is not None:
                    progress(f"real run: {mode}, seed {pair}")
                runs.append(_train(folder / f"{mode}-{pair}", mode, pair, steps, workload, env))
    return RealResult(runs, factor, steps, workload)


def _train(run_dir: Path, mode: str, seed: int, steps: int, workload: str, env: dict[str, str]) -> RealRun:
    command = [sys.executable, "-m", "dtpo", "train", "--workers", "2", "--workload", workload, "--steps", str(steps),
               "--seed", str(seed), "--run-dir", str(run_dir)]
    if mode == "rebalance":
        command += ["--tune", "rebalance"]
    elif mode == "even":
        command += ["--tune", "rebalance", "--rebalance-max-share", "1"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"dtpo train ({mode}, seed {seed}) failed with exit code {done.returncode}:\n{tail}")
    record = json.loads((run_dir / "record.json").read_text())
    rank0 = record["ranks"][0]
    slack = rank0.get("slack") or {}
    return RealRun(mode, seed, float(record["totals"]["throughput"]["value"]),
                   float(rank0["evaluation"]["loss"]), slack.get("shares"), len(slack.get("share_changes") or []))
