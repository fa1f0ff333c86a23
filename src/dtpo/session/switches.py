"""The settings a Session can change between optimizer steps (precision, gradient accumulation, gradient
compression), as the tuners and a user's own loop change them; every change goes into ``switch_log``.

:class:`Switches` is a mixin of :class:`~dtpo.session.session.Session`: it uses the Session's precision,
accumulation, gradient communication, configuration, step counter and timer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dtpo.core.config import COMPRESSIONS, PRECISIONS
from dtpo.core.errors import ConfigError
from dtpo.dist.comm_timing import changes_numerics
from dtpo.session.precision import Precision

if TYPE_CHECKING:
    from dtpo.core.config import SessionConfig
    from dtpo.dist.comm_timing import GradientComm
    from dtpo.session.timer import StepTimer

log = logging.getLogger("dtpo.session.session")


@dataclass(frozen=True)
class Switch:
    """A setting the Session can change between optimizer steps.

    Attributes:
        name: ``"precision"``, ``"grad_accum"`` or ``"compression"``.
        value: The current setting.
        choices: The settings it accepts (``None``: any integer >= 1).
        changes_numerics: Whether the current setting computes different numbers than the reference
            (32-true, no compression, the configured accumulation).
    """

    name: str
    value: Any
    choices: tuple[Any, ...] | None
    changes_numerics: bool


class Switches:
    """The Session's switches: :attr:`switches`, :meth:`set_precision`, :meth:`set_grad_accum`,
    :meth:`set_compression`."""

    precision: Precision
    device: torch.device
    grad_accum: int
    comm: GradientComm | None
    config: SessionConfig
    timer: StepTimer
    switch_log: list[dict[str, Any]]
    world_size: int
    is_main: bool
    _step: int
    _micro: int
    _loader_batches: int

    @property
    def switches(self) -> dict[str, Switch]:
        """The settings a tuner may change between optimizer steps, with whether each changes numerics."""
        comm = self.comm
        compression = comm.compression if comm is not None else "none"
        return {
            "precision": Switch("precision", self.precision.name, PRECISIONS, self.precision.changes_numerics),
            "grad_accum": Switch("grad_accum", self.grad_accum, None, self.grad_accum != self.config.grad_accum),
            "compression": Switch("compression", compression, COMPRESSIONS if comm is not None else ("none",),
                                  changes_numerics(compression)),
        }

    def set_precision(self, name: str) -> None:
        """Train in precision ``name`` from the next micro-batch on (changes numerics unless ``32-true``)."""
        self._check_between_steps("precision")
        if name == self.precision.name:
            return
        self.precision = Precision(name, self.device)
        self._log_switch("precision", name)

    def set_grad_accum(self, micro_batches: int, *, keep_global_batch: bool = False) -> None:
        """Take ``micro_batches`` micro-batches per optimizer step from the next step on.

        Args:
            micro_batches: Micro-batches per optimizer step.
            keep_global_batch: Keep the samples of each step: the Session joins the loader batches a step took
                so far and cuts them into ``micro_batches`` equal micro-batches (:mod:`dtpo.session.rebatch`),
                which leaves every update as it was. Otherwise each loader batch stays a micro-batch, so the
                global batch (and the optimisation) changes with the accumulation.
        """
        self._check_between_steps("grad_accum")
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {micro_batches!r}")
        if not keep_global_batch:
            self._loader_batches = micro_batches
        if micro_batches == self.grad_accum:
            return
        self.grad_accum = micro_batches
        self._log_switch("grad_accum", micro_batches)

    def set_compression(self, name: str, powersgd_rank: int | None = None, *, error_feedback: bool = True) -> None:
        """Compress gradients with ``name`` (``none``, ``fp16``, ``bf16``, ``powersgd``) from the next step on.

        Raises:
            ConfigError: Not a DDP run with several processes, or the backend cannot do it (16-bit floats on MPI).
        """
        self._check_between_steps("compression")
        if self.comm is None:
            if name == "none":
                return
            raise ConfigError(f"compression {name!r} needs DDP with more than one process "
                              f"(strategy {self.config.strategy}, {self.world_size} process(es))")
        rank = powersgd_rank or self.config.powersgd_rank
        self.comm.set_compression(name, powersgd_rank=rank, error_feedback=error_feedback)
        label = f"powersgd-{rank}" + ("" if error_feedback else "-no-ef") if name == "powersgd" else name
        self._log_switch("compression", label)

    def _check_between_steps(self, what: str) -> None:
        if self._micro != 0 or self.timer.batch_ready is not None or self.timer.backward_done:
            raise RuntimeError(f"{what} can change only between optimizer steps (not inside an accumulation "
                               "window or between backward and step)")

    def _log_switch(self, name: str, value: Any) -> None:
        self.switch_log.append({"step": self._step, "setting": name, "value": value})
        if self.is_main:
            log.info("from step %d: %s = %s", self._step, name, value)
