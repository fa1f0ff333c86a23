"""Job-level settings a tuner can choose: numeric precision, gradient accumulation and gradient compression.

Unlike GPU power limits and clocks, these knobs work on any device (a CPU cluster, a cloud VM without root),
and two of them change what training computes: a lower precision and a lossy compression are accepted only
after the convergence guard (:mod:`dtpo.tune.guard`). Gradient accumulation at a fixed global batch does not
change the optimisation (the same samples make each update; only the micro-batch size changes), so it needs
no guard; changing the global batch does, and is offered only on request (``allow_batch_change``).

The tuner searches one knob at a time, in the order precision, accumulation, compression, each from the
choice so far: precision first because it moves compute the most, compression last because whether it pays
depends on how much of a step the compute leaves to communication.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dtpo.core.config import JOB_KNOBS
from dtpo.tune.knob import Knob

ACCUM_CHOICES: tuple[int, ...] = (1, 2, 4, 8, 16)
"""Accumulation steps offered (besides the configured one), where they divide the batch."""

POWERSGD_CHOICES: tuple[int, ...] = (1, 2, 4)
"""PowerSGD ranks offered: each doubling sends twice the factors."""


@dataclass(frozen=True)
class JobSetting:
    """Precision, accumulation and compression in force for every rank of a job.

    Attributes:
        precision: ``32-true``, ``bf16-mixed`` or ``16-mixed``.
        grad_accum: Micro-batches per optimizer step.
        compression: ``none``, ``fp16``, ``bf16`` or ``powersgd``.
        powersgd_rank: PowerSGD's matrix approximation rank (meaningful with ``powersgd`` only).
    """

    precision: str = "32-true"
    grad_accum: int = 1
    compression: str = "none"
    powersgd_rank: int = 1

    def __post_init__(self) -> None:
        if self.compression != "powersgd" and self.powersgd_rank != 1:
            object.__setattr__(self, "powersgd_rank", 1)  # one spelling per setting: it keys the tuner's figures

    @property
    def compression_label(self) -> str:
        """``"powersgd-2"`` for PowerSGD, else the compression's name."""
        return f"powersgd-{self.powersgd_rank}" if self.compression == "powersgd" else self.compression

    @property
    def label(self) -> str:
        """``"bf16-mixed, accum 2, fp16"``."""
        return f"{self.precision}, accum {self.grad_accum}, {self.compression_label}"

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        """Orders settings from the most exact to the least: fp32 first, then fewer micro-batches, then the
        compressions from none to the lowest PowerSGD rank (reports list them in this order, reversed)."""
        precisions = ("16-mixed", "bf16-mixed", "32-true")
        compressions = ("powersgd", "bf16", "fp16", "none")
        return (precisions.index(self.precision), -self.grad_accum, compressions.index(self.compression),
                self.powersgd_rank)

    @property
    def changes_numerics(self) -> bool:
        """Whether training computes other numbers than in ``32-true`` with exact all-reduces."""
        return self.precision != "32-true" or self.compression != "none"

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"precision": self.precision, "grad_accum": self.grad_accum, "compression": self.compression,
                "powersgd_rank": self.powersgd_rank}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSetting:
        """The inverse of :meth:`as_dict`."""
        return cls(str(data["precision"]), int(data["grad_accum"]), str(data["compression"]),
                   int(data.get("powersgd_rank", 1)))


@dataclass(frozen=True)
class JobSpace:
    """What this job can run: the choices each knob may take.

    Attributes:
        precisions: Precisions the device can run.
        compressions: Compressions the model and backend can run (``("none",)`` without DDP on 2+ processes).
        batch_samples: Samples per rank in one optimizer step at the configured accumulation (micro-batch x
            accumulation); candidates at a fixed global batch divide it.
        configured_accum: The accumulation the job was started with.
        allow_batch_change: Offer accumulations that change the global batch (the loader's micro-batch kept).
    """

    precisions: tuple[str, ...]
    compressions: tuple[str, ...]
    batch_samples: int
    configured_accum: int
    allow_batch_change: bool = False

    def accumulations(self) -> list[int]:
        """Accumulation steps to try: at a fixed global batch those that split the step's samples evenly into
        micro-batches of at least one sample; with ``allow_batch_change`` each choice multiplies the loader's
        micro-batch instead."""
        choices = sorted({*ACCUM_CHOICES, self.configured_accum})
        if self.allow_batch_change:
            return choices
        return [k for k in choices if k <= self.batch_samples and self.batch_samples % k == 0]

    def compression_options(self) -> list[tuple[str, int]]:
        """(compression, PowerSGD rank) pairs to try."""
        out: list[tuple[str, int]] = []
        for name in self.compressions:
            if name == "powersgd":
                out.extend((name, r) for r in POWERSGD_CHOICES)
            else:
                out.append((name, 1))
        return out


def _first(base: JobSetting, others: Sequence[JobSetting]) -> list[JobSetting]:
    return [base, *(s for s in others if s != base)]


def job_knobs(names: Sequence[str], space: JobSpace) -> list[Knob]:
    """The knobs to search, in the tuner's order, each from the setting chosen so far to its candidates."""
    dimensions: dict[str, Callable[[Any], list[Any]]] = {
        "precision": lambda base: _first(base, [replace(base, precision=p) for p in space.precisions]),
        "grad-accum": lambda base: _first(base, [replace(base, grad_accum=k) for k in space.accumulations()]),
        "compression": lambda base: _first(base, [replace(base, compression=c, powersgd_rank=r)
                                                  for c, r in space.compression_options()]),
    }
    numerics = {"precision": True, "grad-accum": space.allow_batch_change, "compression": True}
    return [Knob(name, dimensions[name], numerics[name]) for name in JOB_KNOBS if name in names]
