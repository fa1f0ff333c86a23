"""dtpo: scale PyTorch training out, measure every worker, and optimise throughput per watt."""

from dtpo.session import Session, SessionConfig
from dtpo.session.config import EnergyConfig, KnobConfig

__version__ = "0.1.0"

__all__ = ["EnergyConfig", "KnobConfig", "Session", "SessionConfig", "__version__"]
