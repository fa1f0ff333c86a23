"""The training API a script touches: :class:`Session`, its step timer, run lifecycle and callbacks."""

from dtpo.session.session import Session
from dtpo.session.switches import Switch

__all__ = ["Session", "Switch"]
