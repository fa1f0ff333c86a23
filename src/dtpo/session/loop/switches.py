"""The settings a Session can change between optimizer steps (precision, gradient accumulation, gradient
compression), as the tuners and a user's own loop change them; every change goes into a log.

:class:`Switches` owns those settings and nothing of the training loop: the Session asks it to change them
once it has checked that it stands between optimizer steps, and tells it at which step. It is one part of
:class:`~dtpo.session.session.Session`, with its own ``state_dict`` / ``load_state_dict`` for checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dtpo.core.config import COMPRESSIONS, PRECISIONS
from dtpo.core.errors import ConfigError
from dtpo.distributed.comm_timing import changes_numerics
from dtpo.session.loop.precision import Precision

if TYPE_CHECKING:
    from dtpo.core.config import SessionConfig
    from dtpo.distributed.comm_timing import GradientComm

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
    """The current precision, accumulation and compression of one rank, and the log of their changes.

    Args:
        config: The session's configuration (the starting precision and accumulation, the PowerSGD rank, the
            strategy named in errors).
        device: The device the model computes on (the precision's autocast and scaler are made for it).
        comm: The DDP gradient communication to compress (``None``: not a DDP run with several processes).
        world_size: Processes in the run (named in errors).
        announce: Log every change at info level (rank 0 does).

    Attributes:
        precision: The current precision (with its gradient scaler for ``16-mixed``).
        grad_accum: Micro-batches per optimizer step.
        loader_batches: Loader batches per optimizer step (differs from ``grad_accum`` when accumulation was
            changed at a fixed global batch: the step's loader batches are re-cut into micro-batches).
        log: Every change as ``{"step", "setting", "value"}``, in order.
    """

    def __init__(self, config: SessionConfig, device: torch.device, comm: GradientComm | None = None,
                 world_size: int = 1, announce: bool = False) -> None:
        self.config = config
        self.device = device
        self.comm = comm
        self.world_size = world_size
        self.announce = announce
        self.precision = Precision(config.precision, device)
        self.grad_accum = config.grad_accum
        self.loader_batches = config.grad_accum
        self.log: list[dict[str, Any]] = []
        self._on_autocast: Callable[[], None] | None = None  # see when_autocast()

    def when_autocast(self, install: Callable[[], None]) -> None:
        """Call ``install`` once, as soon as a precision that autocasts is in force: now, or when the first is set
        (a switch or a probe). The Session installs its forward wrapper so
        (:func:`~dtpo.session.loop.precision.cast_forward`): a run that stays in ``32-true`` calls no wrapper at each
        forward."""
        self._on_autocast = install
        self._use(self.precision)

    def _use(self, precision: Precision) -> None:
        """Put ``precision`` in force (and call the autocast hook if it is the first that autocasts)."""
        self.precision = precision
        install = self._on_autocast
        if install is not None and precision.autocast_dtype is not None:
            self._on_autocast = None
            install()

    def current(self) -> dict[str, Switch]:
        """The settings a tuner may change, by name, with whether each changes numerics."""
        comm = self.comm
        compression = comm.compression if comm is not None else "none"
        return {
            "precision": Switch("precision", self.precision.name, PRECISIONS, self.precision.changes_numerics),
            "grad_accum": Switch("grad_accum", self.grad_accum, None, self.grad_accum != self.config.grad_accum),
            "compression": Switch("compression", compression, COMPRESSIONS if comm is not None else ("none",),
                                  changes_numerics(compression)),
        }

    def values(self) -> dict[str, Any]:
        """The settings in force by name, as :meth:`current` gives them but without the rest (what every window
        records: read at each window's end, so no :class:`Switch` is made for it)."""
        comm = self.comm
        return {"precision": self.precision.name, "grad_accum": self.grad_accum,
                "compression": comm.compression if comm is not None else "none"}

    def set_precision(self, name: str, step: int) -> None:
        """Train in precision ``name`` from optimizer step ``step`` on (a new gradient scaler for ``16-mixed``)."""
        if name == self.precision.name:
            return
        self._use(Precision(name, self.device))
        self._note(step, "precision", name)

    def set_grad_accum(self, micro_batches: int, step: int, *, keep_global_batch: bool = False) -> None:
        """Take ``micro_batches`` micro-batches per optimizer step from step ``step`` on; with
        ``keep_global_batch`` the loader batches per step stay as they were (see
        :meth:`~dtpo.session.session.Session.set_grad_accum`).

        Raises:
            ConfigError: Not an integer >= 1.
        """
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ConfigError(f"grad_accum must be an integer >= 1, got {micro_batches!r}")
        if not keep_global_batch:
            self.loader_batches = micro_batches
        if micro_batches == self.grad_accum:
            return
        self.grad_accum = micro_batches
        self._note(step, "grad_accum", micro_batches)

    def set_compression(self, name: str, step: int, powersgd_rank: int | None = None, *,
                        error_feedback: bool = True) -> None:
        """Compress gradients with ``name`` from step ``step`` on (see
        :meth:`~dtpo.session.session.Session.set_compression`).

        Raises:
            ConfigError: Not a DDP run with several processes, or the backend cannot do it.
        """
        if self.comm is None:
            if name == "none":
                return
            raise ConfigError(f"compression {name!r} needs DDP with more than one process "
                              f"(strategy {self.config.strategy}, {self.world_size} process(es))")
        rank = powersgd_rank or self.config.powersgd_rank
        self.comm.set_compression(name, powersgd_rank=rank, error_feedback=error_feedback)
        label = f"powersgd-{rank}" + ("" if error_feedback else "-no-ef") if name == "powersgd" else name
        self._note(step, "compression", label)

    @contextlib.contextmanager
    def trying(self, precision: str, compression: str, powersgd_rank: int, *,
               error_feedback: bool = True) -> Iterator[None]:
        """Another precision and compression for a while (a probe), logged nowhere; the current ones come back
        afterwards, the compression afresh (a probe must not leave PowerSGD's error feedback behind)."""
        saved_precision = self.precision
        comm = self.comm
        saved_comm = (comm.compression, comm.powersgd_rank) if comm is not None else None
        try:
            self._use(Precision(precision, self.device))
            if comm is not None:
                comm.set_compression(compression, powersgd_rank, error_feedback=error_feedback)
            yield
        finally:
            self.precision = saved_precision
            if comm is not None and saved_comm is not None:
                comm.set_compression("none")
                comm.set_compression(*saved_comm)

    def state_dict(self) -> dict[str, Any]:
        """The settings, PowerSGD's error feedback and the log (what a checkpoint keeps; the gradient scaler is
        the Session's to save)."""
        comm = self.comm
        return {"precision": self.precision.name, "grad_accum": self.grad_accum,
                "loader_batches": self.loader_batches,
                "compression": comm.compression if comm is not None else "none",
                "powersgd_rank": comm.powersgd_rank if comm is not None else 1,
                "powersgd": comm.powersgd_state() if comm is not None else None,
                "switch_log": list(self.log)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned, through the ``set_*`` methods; the log becomes the saved
        one (nothing is announced). A saved compression is left out where this run has no DDP communication."""
        announce, self.announce = self.announce, False
        try:
            self.set_precision(state["precision"], 0)
            self.set_grad_accum(state["loader_batches"], 0)
            self.set_grad_accum(state["grad_accum"], 0, keep_global_batch=True)
            comm = self.comm
            if comm is not None:
                if (state["compression"], state["powersgd_rank"]) != (comm.compression, comm.powersgd_rank):
                    self.set_compression(state["compression"], 0, state["powersgd_rank"])
                comm.load_powersgd_state(state.get("powersgd"))
        finally:
            self.announce = announce
        self.log = list(state["switch_log"])

    def _note(self, step: int, name: str, value: Any) -> None:
        self.log.append({"step": step, "setting": name, "value": value})
        if self.announce:
            log.info("from step %d: %s = %s", step, name, value)
