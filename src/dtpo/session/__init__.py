"""The training API a script touches: :class:`Session`, its step timer, run lifecycle and callbacks."""

from dtpo.session.session import Session, Switch

__all__ = ["Session", "Switch"]
