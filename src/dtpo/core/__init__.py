"""Small shared types every layer uses: errors, measurements, the run record, the step stream (step events,
windows, the host protocol callbacks read, and its driver)."""

from dtpo.core.errors import ConfigError, DtpoError, LaunchError
from dtpo.core.measurement import Measurement

__all__ = ["ConfigError", "DtpoError", "LaunchError", "Measurement"]
