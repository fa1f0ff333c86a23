"""dtpo: scale PyTorch training out, measure every worker, and optimise throughput per watt.

``dtpo.Session`` (and everything that needs PyTorch) is imported on first use, so commands that do not
train (``dtpo --version``, ``dtpo simulate``, ``dtpo monitor``) start without loading torch.
"""

from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.config import (
    CheckpointConfig,
    EnergyConfig,
    KnobConfig,
    LaunchConfig,
    RunConfig,
    SessionConfig,
    TuneConfig,
    WorkloadConfig,
)
from dtpo.core.steps import Window

__version__ = "0.1.0"

__all__ = ["Callback", "CheckpointConfig", "EnergyConfig", "JobTuneCallback", "KnobConfig", "LaunchConfig",
           "RunConfig", "Session", "SessionConfig", "StepReporter", "Switch", "TuneConfig", "Window", "WorkloadConfig",
           "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("Session", "StepReporter", "Switch"):
        from dtpo import session

        return getattr(session, name)
    if name == "JobTuneCallback":
        from dtpo.session.tuning.job_knobs import JobTuneCallback

        return JobTuneCallback
    raise AttributeError(f"module 'dtpo' has no attribute {name!r}")
