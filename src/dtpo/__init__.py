"""dtpo: scale PyTorch training out, measure every worker, and optimise throughput per watt."""

from dtpo.session import Session, SessionConfig

__version__ = "0.1.0"

__all__ = ["Session", "SessionConfig", "__version__"]
