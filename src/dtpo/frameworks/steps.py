"""The step stream of a JAX, TensorFlow or Keras training loop: :class:`FrameworkSteps`.

These frameworks dispatch work asynchronously: a step's call returns while the device still computes, and the
host may run several steps ahead. Waiting for every step's result would serialise the device (the host could no
longer queue the next step while this one runs); never waiting would put every step's device time in the wrong
window, or in none. So a step is cut where the loop reports it, and the device is waited for only at the steps
that end the warm-up or close a window of steps (:attr:`StepReporter.settles_next`): each window then holds
exactly its own device time, and the per-step times inside a window show how the host paced the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dtpo.core.config import RunConfig
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
        options: Further :class:`StepReporter` arguments (``warmup_steps``, ``window_steps``, ``run_dir``,
            ``energy``, ``tune``, ``progress``, ``summary``, ``run_config``, ...). Under ``dtpo launch`` with a
            configuration (``--tune``, ``--metrics-addr``; ``dtpo train``), the launch's ``run_config`` is the
            default.
    """

    def __init__(self, wait: Callable[[Any], Any], framework: str, gpu: bool = False, device_name: str | None = None,
                 total_steps: int | None = None, **options: Any) -> None:
        self.wait = wait
        self.framework = framework
        config = {"framework": framework, **(options.pop("config", None) or {})}
        contract = LaunchContract.from_environ()
        if "run_config" not in options and contract.config is not None:
            options["run_config"] = RunConfig.load(contract.config)
        ctx = framework_context(gpu)
        self.reporter = StepReporter(total_steps, context=ctx, device_name=device_name or f"{ctx.device} ({framework})",
                                     config=config, **options)
        self._last: Any = None

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
            result: What the step returned (its loss, the new state): waited for only where a window closes.
            tokens: Tokens of the step, where counted.
        """
        if result is not None:
            self._last = result
        if self._last is not None and self.reporter.settles_next:
            self.wait(self._last)
        self.reporter.step(samples, tokens)

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
        self._last = None
        return self.reporter.finish(error)
