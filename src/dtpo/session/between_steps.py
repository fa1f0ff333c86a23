"""What a :class:`~dtpo.session.session.Session` lets change between optimizer steps: the settings a tuner switches
(precision, gradient accumulation, gradient compression, held by its
:class:`~dtpo.session.loop.switches.Switches`), the probe passes it runs before a step
(:class:`~dtpo.session.loop.probe_steps.ProbeSteps`), and the state a checkpoint keeps of the Session itself (step,
switches, gradient scaler, data position)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtpo.session.checkpoint.checkpoints import Checkpoints
    from dtpo.session.loop.precision import Precision
    from dtpo.session.loop.probe import ProbeRequest
    from dtpo.session.loop.probe_steps import ProbeSteps
    from dtpo.session.loop.switches import Switch, Switches
    from dtpo.session.loop.timer import StepTimer


class BetweenSteps:
    """The Session's between-steps surface, for tuners and checkpoints (the Session's constructor makes what it
    reads)."""

    _switches: Switches
    _probes: ProbeSteps
    timer: StepTimer
    checkpoints: Checkpoints
    _step: int  # optimizer steps done
    _micro: int  # micro-batches of the open step taken
    start_step: int  # the step this attempt started at

    @property
    def precision(self) -> Precision:
        """The current precision (:meth:`set_precision` changes it; a probe pass runs in its own)."""
        return self._switches.precision

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (:meth:`set_grad_accum` changes it)."""
        return self._switches.grad_accum

    @property
    def switch_log(self) -> list[dict[str, Any]]:
        """Every switch so far, in order: ``{"step", "setting", "value"}``."""
        return self._switches.log

    @property
    def switches(self) -> dict[str, Switch]:
        """The settings a tuner may change between optimizer steps, with whether each changes numerics."""
        return self._switches.current()

    def set_precision(self, name: str) -> None:
        """Train in precision ``name`` from the next micro-batch on (changes numerics unless ``32-true``)."""
        self._check_between_steps("precision")
        self._switches.set_precision(name, self._step)

    def set_grad_accum(self, micro_batches: int, *, keep_global_batch: bool = False) -> None:
        """Take ``micro_batches`` micro-batches per optimizer step from the next step on.

        Args:
            micro_batches: Micro-batches per optimizer step.
            keep_global_batch: Keep the samples of each step: the Session joins the loader batches a step took
                so far and cuts them into ``micro_batches`` equal micro-batches (:mod:`dtpo.session.loop.rebatch`),
                which leaves every update as it was. Otherwise each loader batch stays a micro-batch, so the
                global batch (and the optimisation) changes with the accumulation.
        """
        self._check_between_steps("grad_accum")
        self._switches.set_grad_accum(micro_batches, self._step, keep_global_batch=keep_global_batch)

    def set_compression(self, name: str, powersgd_rank: int | None = None, *, error_feedback: bool = True) -> None:
        """Compress gradients with ``name`` (``none``, ``fp16``, ``bf16``, ``powersgd``) from the next step on.

        Raises:
            ConfigError: Not a DDP run with several processes, or the backend cannot do it (16-bit floats on MPI).
        """
        self._check_between_steps("compression")
        self._switches.set_compression(name, self._step, powersgd_rank, error_feedback=error_feedback)

    def keep_probe_batch(self) -> None:
        """Keep a copy of the next micro-batch as the batch every probe runs on."""
        self._probes.keep_next_batch()

    def request_probe(self, request: ProbeRequest) -> None:
        """Run a probe (:mod:`dtpo.session.loop.probe`) before the next optimizer step; every rank must ask for the
        same probes at the same step. ``request.done`` gets the result."""
        self._probes.request(request)

    def state_dict(self) -> dict[str, Any]:
        """This rank's training state: ``step`` (optimizer steps done), ``switches``, the gradient ``scaler``
        (``16-mixed``) and the ``data`` position of the current :meth:`batches` call; what checkpoints save
        besides the model, the optimizers, the RNG states and the callbacks."""
        scaler = self.precision.scaler
        return {"step": self._step, "switches": self._switches.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "data": self.checkpoints.data.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned, between optimizer steps: the switches through their
        ``set_*`` methods, and training continues at ``state["step"]`` (a new warm-up counts from there); the
        next :meth:`batches` call moves its iterable to the saved data position."""
        self._check_between_steps("the state")
        self._switches.load_state_dict(state["switches"])
        scaler = self.precision.scaler
        if state.get("scaler") is not None and scaler is not None:
            scaler.load_state_dict(state["scaler"])
        self.checkpoints.data.load_state_dict(state["data"])
        self.start_step = self._step = int(state["step"])

    def _between_steps(self) -> bool:
        """Whether no optimizer step is under way (no micro-batch taken, no backward waiting for its step)."""
        return self._micro == 0 and self.timer.batch_ready is None and not self.timer.backward_done

    def _check_between_steps(self, what: str) -> None:
        if not self._between_steps():
            raise RuntimeError(f"{what} can change only between optimizer steps (not inside an accumulation "
                               "window or between backward and step)")
