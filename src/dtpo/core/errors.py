"""Errors a user can cause.

Each ends the command with one clear line on stderr and exit code 2 (the CLI catches :class:`DtpoError`).
Errors in dtpo's own code are ordinary exceptions and keep their traceback.
"""

from __future__ import annotations

import signal


class DtpoError(Exception):
    """A problem the user can fix: bad input, missing file, unreachable peer.

    Attributes:
        exit_code: Process exit code the CLI uses for this error.
    """

    exit_code: int = 2


class ConfigError(DtpoError, ValueError):
    """An invalid configuration value (a flag, a Session argument)."""


class LaunchError(DtpoError):
    """The launcher could not start or join a run (rendezvous, script, workers)."""


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped (empty if there is none): errors are shown in one line."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def signal_name(signum: int) -> str:
    """``SIGINT`` for 2, and so on; ``signal N`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
