"""Waking the agent in a worker ``dtpo launch`` started: :func:`start`, called by the agent's ``sitecustomize``.

Inert unless the launch contract says ``agent`` (``DTPO_AGENT=1``, which ``dtpo launch`` sets and
``--no-agent`` leaves unset); the flag is taken out of the environment at once, so the script's own child
processes (data-loader workers, tools it runs) are not measured as ranks. Nothing of torch is touched before
the script imports it: the hooks go in once ``import torch`` has finished.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import AGENT_ENV, FRAMEWORK_ENV, LaunchContract
from dtpo.core.logs import configure_logging
from dtpo.core.post_import import when_imported

log = logging.getLogger(__name__)

SAMPLES_ENV = "DTPO_SAMPLES_PER_STEP"


def samples_per_step(environ: Any = None) -> int | None:
    """``DTPO_SAMPLES_PER_STEP``: the samples each rank processes per iteration, where the user says so.

    Raises:
        ConfigError: Not a positive integer (one line, naming the variable).
    """
    text = (os.environ if environ is None else environ).get(SAMPLES_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError(f"{SAMPLES_ENV} must be a positive integer (samples per step on each rank), got {text!r}")
    return int(text)


def start() -> bool:
    """Wake the agent in this process if the launcher asked for it. Returns whether it is awake."""
    try:
        contract = LaunchContract.from_environ()
        samples = samples_per_step()
    except ConfigError as exc:
        if os.environ.pop(AGENT_ENV, None):
            configure_logging()
            log.warning("agent: %s; this worker is not measured", exc)
        return False
    runs_on = "torch"
    if contract.framework is not None:
        os.environ.pop(FRAMEWORK_ENV, None)
        configure_logging()
        from dtpo.frameworks.bootstrap import prepare

        runs_on = prepare(contract)
    if not contract.agent:
        return False
    os.environ.pop(AGENT_ENV, None)
    configure_logging()
    agent = Agent(contract, samples)
    from dtpo.distributed.worker_exit import settle_native_threads

    atexit.register(settle_native_threads)  # registered first, so it runs after every other exit handler
    if runs_on == "torch":
        when_imported("torch", agent.torch_imported)
    when_imported("keras", agent.keras_imported)
    return True


class Agent:
    """The agent of one worker process: its hooks, its tracker and, from the first iteration, its run.

    Args:
        contract: What the launcher said.
        samples: ``DTPO_SAMPLES_PER_STEP``, if set.
    """

    def __init__(self, contract: LaunchContract, samples: int | None) -> None:
        self.contract = contract
        self.samples = samples
        self.run: Any = None  # dtpo.agent.run.AgentRun, from the first iteration on
        self.tracker: Any = None
        self.hooks: Any = None
        self.error: BaseException | None = None

    def torch_imported(self, torch: ModuleType) -> None:
        """Install the hooks (``import torch`` has just finished)."""
        try:
            from dtpo.agent.torch_hooks import TorchHooks
            from dtpo.agent.tracker import StepTracker

            self.tracker = StepTracker(self.open_run, self.samples)
            self.hooks = TorchHooks(self.tracker)
            self.hooks.install()
        except Exception as exc:  # noqa: BLE001 - never fail the script's own import of torch
            log.warning("agent: cannot hook into torch (%s: %s); the script runs unmeasured", type(exc).__name__, exc)
            return
        previous = sys.excepthook

        def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            self.error = value
            previous(kind, value, tb)

        sys.excepthook = excepthook

    def keras_imported(self, keras: ModuleType) -> None:
        """Have every ``Model.fit`` report its steps through dtpo's Keras callback (``import keras`` has just
        finished); a fit that already has one keeps its own."""
        try:
            from dtpo.frameworks.keras_fit import measure_fit

            measure_fit(keras, self.samples, self.contract.config)
        except Exception as exc:  # noqa: BLE001 - never fail the script's own import of keras
            log.warning("agent: cannot hook into Keras (%s: %s); Model.fit runs unmeasured", type(exc).__name__, exc)

    def open_run(self, tracker: Any) -> Any:
        """The run, made at the end of the first iteration; ``None`` where the agent stands aside."""
        from dtpo.session.stream_run import StreamRun

        if StreamRun.opened:
            log.debug("agent: the script reports its own steps (dtpo.Session, dtpo.StepReporter or a dtpo "
                     "callback): the agent stands aside")
            return None
        try:
            from dtpo.agent.channel import agent_context
            from dtpo.agent.run import AgentRun

            ctx = agent_context(_device(tracker.ddp))
            config = self._config(tracker)
            self._handle_sigterm()
            self.run = AgentRun(ctx, config, _script_name())
        except Exception as exc:  # noqa: BLE001 - the script goes on unmeasured
            log.warning("agent: cannot start measuring (%s: %s); the script runs unmeasured", type(exc).__name__, exc)
            return None
        atexit.register(self.finish)
        return self.run

    def _config(self, tracker: Any) -> Any:
        from dtpo.core.config import RunConfig

        config = RunConfig.load(self.contract.config) if self.contract.config else RunConfig()
        strategy = "ddp" if tracker.ddp is not None else "fsdp" if _fsdp_in_use() else config.session.strategy
        config = config.replace(session={"strategy": strategy})
        if config.tune.stragglers and tracker.ddp is None:
            log.warning("agent: --tune stragglers needs DDP's gradient-ready times and this script builds no "
                        "DistributedDataParallel model: not tuned")
            config = config.replace(tune={"knob": None})
        return config

    def finish(self, error: BaseException | None = None) -> None:
        """End the run (at exit: with the exception the script died of, if any)."""
        run = self.run
        if run is None:
            return
        if self.hooks is not None:
            self.hooks.remove()
        from dtpo.session.stream_run import StreamRun

        if StreamRun.opened > 1:  # the script opened a producer of its own after the agent started
            run.abandon()
            return
        try:
            run.finish(error if error is not None else self.error)
        except Exception as exc:  # noqa: BLE001 - at exit: say it, never a traceback
            log.warning("agent: could not write this rank's record (%s: %s)", type(exc).__name__, exc)

    def _handle_sigterm(self) -> None:
        """On SIGTERM (torchrun stopping the workers, a preemption) write the record as ``interrupted``, then die
        of the signal as the script would have; a handler of the script's own is left alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        from dtpo.distributed.parent_death import end_with_parent
        from dtpo.session.lifecycle import Interrupted

        def on_term(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.finish(Interrupted(signum))
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        if self.contract.launched:  # a launcher killed outright: this worker hears SIGTERM, not silence
            end_with_parent(signal.SIGTERM)


def _script_name() -> str:
    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


def _device(ddp: Any) -> Any:
    import torch

    if ddp is not None:
        try:
            return next(ddp.module.parameters()).device
        except StopIteration:
            pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _fsdp_in_use() -> bool:
    return "torch.distributed.fsdp" in sys.modules
