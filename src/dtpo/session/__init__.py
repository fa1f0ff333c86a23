"""The training API a script touches: :class:`Session`."""

from dtpo.session.config import SessionConfig
from dtpo.session.session import Session

__all__ = ["Session", "SessionConfig"]
