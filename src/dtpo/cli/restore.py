"""``dtpo restore``: put back GPU settings a crashed dtpo process left changed on this machine."""

from __future__ import annotations

import sys

from dtpo.devices.journal import KnobJournal, restore_pending


def restore_at_start() -> None:
    """Every dtpo command starts by restoring what a killed dtpo process left changed (silent when nothing)."""
    restore_pending(log=lambda line: print(f"dtpo: {line}", file=sys.stderr))


def restore_command() -> None:
    """Restore the original power limits and clocks of GPUs that a crashed dtpo run left changed."""
    journal = KnobJournal()
    lines = restore_pending(journal)
    for line in lines:
        print(line)
    if not lines:
        print(f"nothing to restore ({journal.path} has no entries)")
