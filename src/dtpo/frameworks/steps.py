"""The step stream of a JAX, TensorFlow or Keras training loop: :class:`FrameworkSteps`.

These frameworks dispatch work asynchronously: a step's call returns while the device still computes, and the
host may run several steps ahead. Waiting for every step's result would serialise the device (the host could no
longer queue the next step while this one runs); never waiting would put every step's device time in the wrong
window, or in none. So a step is cut where the loop reports it, and the device is waited for only at the steps
that end the warm-up or close a window of steps (:meth:`StepReporter.settles_at`), and there for the result of
the step before, not the one just queued: the device goes on with that one while the host waits, so the queue
never runs dry (waiting for the last step queued would leave the device idle for one dispatch per window, about
1 % of a 3 ms step). Each window then holds exactly one window of device time, from the end of the step before
its first to the end of the step before its last (one step later than its labels, the same for every window);
the last step of a known total, and the end of the run, wait for the very last result. A caller whose results
are consumed by the next step (Keras on JAX donates its state to the next step) waits for the last one instead
(``lag=False``). The per-step times inside a window show how the host paced the queue.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtpo.core.config import EnergyConfig, KnobConfig, RunConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.record import RunRecord
from dtpo.frameworks.channel import framework_context
from dtpo.session.step_reporter import StepReporter

log = logging.getLogger(__name__)


class FrameworkSteps:
    """One rank's steps of a training loop of another framework, fed to a :class:`StepReporter`.

    Args:
        wait: Blocks until a step's result is computed (``jax.block_until_ready``; for TensorFlow, reading the
            result back).
        framework: The framework's name, for the record (``"jax"``, ``"tensorflow"``, ``"keras/jax"``, ...).
        gpu: The framework computes on this rank's GPU (energy and the knobs look there, through NVML).
        device_name: How the record names the device (default: ``cuda:N`` or ``cpu``).
        total_steps: Steps the loop will run, where known.
        lag: Where a window closes, wait for the step before the last one queued (``False``: for the last one,
            where a step consumes the previous step's result, so that it cannot be waited for).
        options: Further :class:`StepReporter` arguments (``warmup_steps``, ``window_steps``, ``run_dir``,
            ``energy``, ``knobs``, ``tune``, ``progress``, ``summary``, ``run_config``, ...), merged into one
            configuration by :func:`run_config_for` (under ``dtpo launch`` or ``dtpo train``, on the launch's).
    """

    def __init__(self, wait: Callable[[Any], Any], framework: str, gpu: bool = False, device_name: str | None = None,
                 total_steps: int | None = None, lag: bool = True, **options: Any) -> None:
        self.wait = wait
        self.framework = framework
        self.lag = lag
        config = {"framework": framework, **(options.pop("config", None) or {})}
        options["run_config"] = run_config_for(framework, options.pop("tune", None), options)
        ctx = framework_context(gpu)
        self.reporter = StepReporter(total_steps, context=ctx, device_name=device_name or f"{ctx.device} ({framework})",
                                     config=config, **options)
        self._last: Any = None
        self._previous: Any = None

    @property
    def step_count(self) -> int:
        """Steps reported so far."""
        return self.reporter.step_count

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` has run."""
        return self.reporter.lifecycle.finished

    def start(self) -> None:
        """Training starts: the first step begins now."""
        self.reporter.start()

    def step(self, samples: int, result: Any = None, tokens: int | None = None) -> None:
        """A training step was dispatched, processing ``samples`` samples (``tokens`` tokens) on this rank.

        Args:
            samples: Samples of the step on this rank.
            result: What the step returned (its loss, the new state): waited for where the next step closes a
                window (:meth:`StepReporter.settles_at` ``(2)``: pass it at least then; with ``lag=False`` where
                this one does), or at the end.
            tokens: Tokens of the step, where counted.
        """
        if result is not None:
            self._previous, self._last = self._last, result
        reporter = self.reporter
        if reporter.settles_next:
            self._settle(exact=reporter.last_step_next)
        reporter.step(samples, tokens)

    def _settle(self, exact: bool) -> None:
        """Wait for the step before the last one queued (``exact``, or without ``lag``: for the last one)."""
        if not exact and self.lag and self._previous is not None:
            try:
                self.wait(self._previous)
                return
            except Exception:  # noqa: BLE001 - e.g. a buffer the next step consumed (JAX's donated arguments)
                log.debug("%s: the previous step's result is gone; waiting for the last one", self.framework,
                          exc_info=True)
        if self._last is not None:
            self.wait(self._last)

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Wait for the last step's work, then end the run (see :meth:`StepReporter.finish`).

        Returns:
            The run record on rank 0, ``None`` elsewhere.
        """
        if self.finished:
            return None
        if self._last is not None and error is None:
            try:
                self.wait(self._last)
            except Exception as exc:  # noqa: BLE001 - the record matters more than the last result
                log.warning("%s: could not wait for the last step (%s: %s)", self.framework, type(exc).__name__, exc)
        self._last = self._previous = None
        return self.reporter.finish(error)


_SESSION_OPTIONS = ("warmup_steps", "window_steps", "flush_every")


def run_config_for(framework: str, tune: str | TuneConfig | None, options: dict[str, Any]) -> RunConfig:
    """The run's whole configuration: the caller's ``run_config``, else the launch's (``dtpo launch --tune``,
    ``dtpo train``), else the defaults; with ``tune`` (a knob's name keeps the base's cost; a whole
    :class:`TuneConfig` replaces it) and the reporter options passed beside it (``warmup_steps``,
    ``window_steps``, ``flush_every``, ``energy``, ``knobs``; taken out of ``options``) on top. The workload is
    named after the script, as the agent names it, unless ``dtpo train`` named its own.

    Raises:
        ConfigError: A bad ``tune`` or ``run_config``.
    """
    if tune is not None and not isinstance(tune, str | TuneConfig):
        raise ConfigError(f"tune must be a knob name or a TuneConfig, got {tune!r}")
    base = options.pop("run_config", None)
    if base is None:
        path = LaunchContract.from_environ().config
        base = RunConfig.load(path) if path is not None else RunConfig()
    if not isinstance(base, RunConfig):
        raise ConfigError(f"run_config must be a RunConfig, got {type(base).__name__}")
    session = {name: options.pop(name) for name in _SESSION_OPTIONS if name in options}
    changes: dict[str, dict[str, Any]] = {"session": {"count_flops": False, **session}}
    if tune is not None:
        changes["tune"] = {"knob": tune} if isinstance(tune, str) else tune.to_dict()
    energy = options.pop("energy", None)
    if energy is not None:
        changes["energy"] = energy.to_dict() if isinstance(energy, EnergyConfig) else {"enabled": bool(energy)}
    knobs = options.pop("knobs", None)
    if knobs is not None:
        changes["knobs"] = knobs.to_dict() if isinstance(knobs, KnobConfig) else dict(knobs)
    if base.workload.framework == "torch":  # not dtpo train's own workload: the script
        script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        changes["workload"] = {"name": f"script:{script}", "framework": framework.split("/", 1)[0]}
    return base.replace(**changes)
