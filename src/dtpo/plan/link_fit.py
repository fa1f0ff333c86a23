"""Calibrate a link's alpha (latency) and bandwidth from measured ring all-reduce timings.

Design note
-----------
Each sample is ``(n_bytes, p, seconds)``: one all-reduce of ``n_bytes`` over ``p`` ranks (e.g. the median of
an nccl-tests ``all_reduce_perf`` row, or of ``torch.distributed.all_reduce`` timed after warm-up). The ring
model of :func:`dtpo.plan.collectives.ring_all_reduce` is linear in its two unknowns::

    t = alpha * 2(p-1) + beta * 2(p-1)/p * n,      beta = 1 / bandwidth

so a least-squares fit gives both. Timing noise is roughly multiplicative (a few percent of each time) and
sizes span many decades, so by default every equation is divided by its measured time: each sample's
*relative* error counts the same, and the small messages that pin alpha are not drowned by the large ones
(``relative=False`` gives plain least squares on seconds). Samples need at least two distinct message sizes.

A negative alpha (it happens when the small sizes are noisy or the link is pipelined better than the model
says) is not a latency: the fit then keeps ``alpha = 0``, fits the bandwidth alone and says so in ``note``.
A non-positive bandwidth term means the timings do not grow with size, and is refused.

Where the probe also timed the host CPU each all-reduce used (``dtpo.distributed.link_probe``'s ``cpu_samples``),
:func:`fit_cpu_cost` fits the CPU seconds per byte a rank moves, ``cpu = c0 + c * 2(p-1)/p * n``, by plain
least squares (the large messages, which DDP's buckets are, weigh most). gloo over TCP copies, sums and runs
the socket stack on the host's cores: when the job computes on those cores, that work is not hidden behind
backward (:func:`dtpo.plan.step_model.step_time`). NCCL on GPUs leaves it to DMA engines and NICs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.plan.collectives import LinkCost, ring_all_reduce

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted link.

    Attributes:
        alpha_s: Per-message latency, seconds (0 when the free fit gave a negative one; see ``note``).
        bandwidth_Bps: Achieved bandwidth, bytes/s (the bus bandwidth the ring model uses).
        residual_rms_s: Root mean square of measured minus fitted time over the samples, seconds.
        points: Number of samples fitted.
        note: Empty, or what the fit had to do (alpha forced to 0).
        residual_rms_rel: Root mean square of the relative residuals (measured / fitted - 1); infinite when a
            sample is fitted at 0 s (a 0-byte message with alpha forced to 0).
        cpu_s_per_byte: Host CPU seconds per byte a rank moves (:func:`fit_cpu_cost`); 0 when not measured.
    """

    alpha_s: float
    bandwidth_Bps: float
    residual_rms_s: float
    points: int
    note: str = ""
    residual_rms_rel: float = 0.0
    cpu_s_per_byte: float = 0.0

    def predict(self, n_bytes: float, p: int) -> float:
        """Ring all-reduce time of ``n_bytes`` over ``p`` ranks with the fitted alpha and bandwidth, seconds."""
        return ring_all_reduce(n_bytes, p, self.alpha_s, self.bandwidth_Bps)

    def link_cost(self) -> LinkCost:
        """The fit as a :class:`dtpo.plan.collectives.LinkCost`."""
        return LinkCost(self.alpha_s, self.bandwidth_Bps, self.cpu_s_per_byte)


def _samples(samples: Sequence[tuple[float, float, float]], zero_ok: bool = False
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sizes, participant counts and times as arrays, each sample checked (ConfigError naming the bad one); a time
    of 0 s is refused unless ``zero_ok`` (a CPU time can read 0 at the clock's resolution)."""
    sizes: list[float] = []
    ranks: list[int] = []
    times: list[float] = []
    for i, sample in enumerate(samples):
        try:
            n_bytes, p, seconds = sample
            n, t, ranks_f = float(n_bytes), float(seconds), float(p)
        except (TypeError, ValueError):
            raise ConfigError(f"sample {i} must be (n_bytes, p, seconds) numbers, not {sample!r}") from None
        if not (math.isfinite(n) and n >= 0):
            raise ConfigError(f"sample {i}: message size must be >= 0 bytes, not {n_bytes!r}")
        count = int(ranks_f) if math.isfinite(ranks_f) and ranks_f.is_integer() else 0
        if count < 2:
            raise ConfigError(f"sample {i}: an all-reduce over p={p!r} ranks says nothing about a link (need p >= 2)")
        if not (math.isfinite(t) and (t >= 0 if zero_ok else t > 0)):
            raise ConfigError(f"sample {i}: measured time must be {'>=' if zero_ok else '>'} 0 s, not {seconds!r}")
        sizes.append(n)
        ranks.append(count)
        times.append(t)
    return np.asarray(sizes), np.asarray(ranks, dtype=float), np.asarray(times)


def fit_alpha_beta(samples: Sequence[tuple[float, float, float]], *, relative: bool = True) -> AlphaBetaFit:
    """Least-squares fit of ``t = alpha * 2(p-1) + (1/bandwidth) * 2(p-1)/p * n`` to ring all-reduce timings.

    Args:
        samples: ``(n_bytes, p, measured_seconds)`` per all-reduce, ``p >= 2``.
        relative: Weight each equation by ``1 / measured_seconds`` (least squares on relative error).

    Raises:
        ConfigError: A bad sample, fewer than two distinct message sizes, samples that cannot separate
            latency from bandwidth, or a fit whose bandwidth term is not positive.
    """
    n, p, t = _samples(samples)
    distinct = len(np.unique(n))
    if distinct < 2:
        raise ConfigError(f"need all-reduce timings at >= 2 distinct message sizes to fit alpha and bandwidth, "
                          f"got {distinct}")
    design = np.column_stack([2 * (p - 1), 2 * (p - 1) / p * n])
    weights = 1 / t if relative else np.ones_like(t)
    a, b = design * weights[:, None], t * weights
    if np.linalg.matrix_rank(a) < 2:
        raise ConfigError("the samples cannot separate latency from bandwidth (size/p is the same in all of them)")
    (alpha, beta), *_ = np.linalg.lstsq(a, b, rcond=None)
    note = ""
    if alpha < 0:
        note = f"free fit gave a negative alpha ({alpha:.3g} s): alpha fixed at 0, bandwidth fitted alone"
        log.info("link fit: %s", note)
        column = a[:, 1]
        beta = float(column @ b / (column @ column)) if column @ column > 0 else 0.0
        alpha = 0.0
    if not beta > 0:
        raise ConfigError("the fit gives a non-positive time per byte: the timings do not grow with message size")
    fitted = design @ np.array([alpha, beta])
    return AlphaBetaFit(
        alpha_s=float(alpha),
        bandwidth_Bps=float(1 / beta),
        residual_rms_s=float(np.sqrt(np.mean((t - fitted) ** 2))),
        points=len(t),
        note=note,
        residual_rms_rel=float(np.sqrt(np.mean((t / fitted - 1) ** 2))) if np.all(fitted > 0) else math.inf,
    )


def fit_cpu_cost(cpu_samples: Sequence[tuple[float, float, float]]) -> float:
    """Host CPU seconds per byte a rank moves in a ring all-reduce, from ``(n_bytes, p, cpu_seconds)`` samples:
    the slope ``c`` of ``cpu = c0 + c * 2(p-1)/p * n`` by least squares, at least 0 (see the module docs).

    Raises:
        ConfigError: A bad sample, or fewer than two distinct message sizes.
    """
    n, p, cpu = _samples(cpu_samples, zero_ok=True)
    if len(np.unique(n)) < 2:
        raise ConfigError("need CPU timings at >= 2 distinct message sizes to fit a CPU cost per byte")
    moved = 2 * (p - 1) / p * n
    design = np.column_stack([np.ones_like(moved), moved])
    (_, slope), *_ = np.linalg.lstsq(design, cpu, rcond=None)
    return max(float(slope), 0.0)


def fit_link_probe(doc: dict[str, Any]) -> AlphaBetaFit:
    """The fit of a ``dtpo.distributed.link_probe`` file's contents: alpha and bandwidth from its ``samples``, and the
    CPU cost per byte from its ``cpu_samples`` where it has them (probes written before they existed do not).

    Raises:
        ConfigError: A document without ``samples``, or samples that cannot be fitted.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise ConfigError("a link probe file holds {\"samples\": [[n_bytes, p, seconds], ...], ...}")
    fit = fit_alpha_beta([tuple(s) for s in doc["samples"]])
    cpu_samples = doc.get("cpu_samples")
    if not cpu_samples:
        return fit
    return replace(fit, cpu_s_per_byte=fit_cpu_cost([tuple(s) for s in cpu_samples]))
