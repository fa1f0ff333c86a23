"""The producers of the step stream a script touches: :class:`Session` (its step timer, run lifecycle and
callbacks) and, for a loop that keeps its own, :class:`StepReporter`."""

from dtpo.session.loop.switches import Switch
from dtpo.session.session import Session
from dtpo.session.step_reporter import StepReporter

__all__ = ["Session", "StepReporter", "Switch"]
