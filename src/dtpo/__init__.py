"""dtpo: scale PyTorch training out, measure every worker, and optimise throughput per watt."""

from dtpo.core.callbacks import Callback, Window
from dtpo.core.config import EnergyConfig, KnobConfig, LaunchConfig, RunConfig, SessionConfig, WorkloadConfig
from dtpo.session import Session

__version__ = "0.1.0"

__all__ = ["Callback", "EnergyConfig", "KnobConfig", "LaunchConfig", "RunConfig", "Session", "SessionConfig",
           "Window", "WorkloadConfig", "__version__"]
