"""Logging for dtpo: one rank-aware format (``dtpo[rank 1] message``) set up by the CLI and the Session.

Every module logs through ``logging.getLogger(__name__)``; nothing below the CLI prints notices itself.
Tables and summaries meant to be read are printed with rich, not logged.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "dtpo"


class RankFormatter(logging.Formatter):
    """``dtpo: message`` in a single process, ``dtpo[rank N]: message`` in a distributed run.

    Warnings and errors say so (``dtpo[rank 1]: warning: ...``); info lines do not.
    """

    def format(self, record: logging.LogRecord) -> str:
        rank = os.environ.get("RANK")
        world = os.environ.get("WORLD_SIZE")
        prefix = f"dtpo[rank {rank}]" if rank is not None and world not in (None, "1") else "dtpo"
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        message = record.getMessage()
        if record.exc_info and record.levelno >= logging.ERROR:
            message += "\n" + self.formatException(record.exc_info)
        return f"{prefix}: {level}{message}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (tests and redirections replace it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def configure_logging(level: int | None = None) -> None:
    """Send dtpo's log records to stderr in the rank-aware format, once per process.

    Args:
        level: Threshold; default ``INFO``, or ``DTPO_LOG_LEVEL`` (a level name) when set.
    """
    logger = logging.getLogger(LOGGER_NAME)
    if level is None:
        name = os.environ.get("DTPO_LOG_LEVEL", "INFO").upper()
        level = logging.getLevelName(name) if isinstance(logging.getLevelName(name), int) else logging.INFO
    logger.setLevel(level)
    if any(getattr(h, "_dtpo", False) for h in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(RankFormatter())
    handler._dtpo = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
