"""A micro-batch's time as a fixed part and a per-sample part, fitted from two or more batch sizes.

Small batches run slower per sample: every micro-batch pays kernel launches, Python and framework work, the
data loader's hand-over, whatever its size. With times ``t_b`` measured at batch sizes ``b`` on one GPU (or
CPU worker), the least-squares line ``t(b) = fixed_s + per_sample_s x b`` splits them; the planner carries the
fixed part's share of a micro-batch at the calibration batch (:func:`fixed_share`) to whatever it calibrated on,
so a job whose per-GPU batch shrinks at scale (strong scaling) gets slower per sample.

With three or more points the fit also says how well the points pin the fixed part down: its confidence
interval (:attr:`BatchFit.fixed_range_s`, Student's t on the residuals' degrees of freedom). Points far above the
batch a plan goes down to leave the intercept loose, and a strong-scaling plan moves with it, so the planner shows
the throughput at both ends of that interval.

``dtpo bench --batch-sizes 8,32,128`` measures the points (runs ``batch-B/`` of a bench directory);
:func:`batch_times_from_bench` reads them back.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from dtpo.core.errors import ConfigError

log = logging.getLogger(__name__)

BATCH_RUN_PREFIX = "batch-"
"""A bench's run at one batch size lives in ``batch-<B>/`` of its directory."""

CONFIDENCE = 0.95
"""Two-sided confidence of the fixed part's interval."""


@dataclass(frozen=True)
class BatchFit:
    """``t(b) = fixed_s + per_sample_s x b``, least squares over the measured points.

    Attributes:
        fixed_s: Time of a micro-batch that does not grow with its size (clamped at 0: a negative intercept is
            measurement noise, not time given back).
        per_sample_s: Time each sample adds.
        points: The ``(batch, seconds)`` points fitted, ascending by batch.
        fixed_range_s: The fixed part's :data:`CONFIDENCE` interval, clamped at 0 and at the smallest micro-batch's
            time (``None`` with two points: no degrees of freedom are left to judge the scatter by).
    """

    fixed_s: float
    per_sample_s: float
    points: tuple[tuple[int, float], ...]
    fixed_range_s: tuple[float, float] | None = None

    def seconds(self, batch: float) -> float:
        """One micro-batch of ``batch`` samples."""
        return self.fixed_s + self.per_sample_s * batch

    def fixed_share(self, batch: float) -> float:
        """The fixed part's share of a micro-batch of ``batch`` samples."""
        total = self.seconds(batch)
        return self.fixed_s / total if total > 0 else 0.0


def fit_batch_times(points: list[tuple[int, float]] | tuple[tuple[int, float], ...]) -> BatchFit:
    """Fit the fixed and per-sample parts of a micro-batch's time to ``(batch, seconds)`` points.

    Raises:
        ConfigError: Fewer than two distinct batch sizes, or a non-positive time or batch.
    """
    ordered = tuple(sorted((int(b), float(t)) for b, t in points))
    if any(b <= 0 or not t > 0 for b, t in ordered):
        raise ConfigError("micro-batch times need positive batch sizes and positive seconds")
    sizes = [b for b, _ in ordered]
    if len(set(sizes)) < 2:
        raise ConfigError("a fixed and a per-sample part need micro-batch times at two or more batch sizes")
    mean_b = statistics.fmean(sizes)
    mean_t = statistics.fmean(t for _, t in ordered)
    spread = sum((b - mean_b) ** 2 for b in sizes)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in ordered) / spread
    if slope <= 0:
        listed = ", ".join(f"{b}: {t:.3g} s" for b, t in ordered)
        raise ConfigError(f"micro-batch times do not grow with the batch ({listed}):"
                          " too noisy to split a fixed part from a per-sample part")
    fixed = mean_t - slope * mean_b
    dof = len(ordered) - 2
    interval = None
    if dof > 0:  # the intercept's standard error, from the residuals' scatter
        residual_var = sum((t - fixed - slope * b) ** 2 for b, t in ordered) / dof
        half = t_quantile(CONFIDENCE, dof) * math.sqrt(residual_var * (1 / len(ordered) + mean_b ** 2 / spread))
        # no part of a micro-batch is negative, and none fixed is longer than the smallest micro-batch measured
        interval = (max(fixed - half, 0.0), min(max(fixed + half, 0.0), ordered[0][1]))
    if fixed < 0:
        log.info("micro-batch fit: intercept %.3g s below zero, taken as no fixed part", fixed)
        slope = sum(b * t for b, t in ordered) / sum(b * b for b in sizes)  # through the origin instead
        fixed = 0.0
    return BatchFit(fixed, slope, ordered, interval)


def t_quantile(confidence: float, dof: int) -> float:
    """Student's t quantile of a two-sided ``confidence`` interval with ``dof`` degrees of freedom: exact for one
    and two, else the Cornish-Fisher expansion around the normal quantile (within 1 % from three on)."""
    p = 0.5 + confidence / 2
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
    z = statistics.NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3))


def micro_batch_times(record: dict) -> tuple[float, float]:
    """``(batch, seconds)`` of one micro-batch in a run record: medians over its first rank's measured steps
    (forward and backward, ``compute_s``, over the accumulation).

    Raises:
        ConfigError: The record has no measured steps.
    """
    ranks = record.get("ranks") or []
    steps = [s for s in (ranks[0].get("steps") or []) if not s.get("warmup") and "compute_s" in s] if ranks else []
    if not steps:
        raise ConfigError("the run record has no measured steps")
    accum = int((record.get("config") or {}).get("session", {}).get("grad_accum", 1))
    batch = statistics.median(float(s["samples"]) for s in steps) / accum
    return batch, statistics.median(float(s["compute_s"]) for s in steps) / accum


def batch_times_from_bench(bench_dir: Path) -> tuple[tuple[int, float], ...]:
    """The micro-batch times of a bench's ``batch-<B>/`` runs, ascending by batch (empty when it has none).

    Raises:
        ConfigError: A batch run's record cannot be read or has no measured steps.
    """
    points = []
    for run in sorted(bench_dir.glob(f"{BATCH_RUN_PREFIX}*")):
        suffix = run.name[len(BATCH_RUN_PREFIX):]
        path = run / "record.json"
        if not suffix.isdigit() or not path.exists():
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from None
        try:
            batch, seconds = micro_batch_times(record)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        points.append((round(batch), seconds))
    return tuple(sorted(points))
