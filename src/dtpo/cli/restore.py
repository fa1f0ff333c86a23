"""``dtpo restore``: put back GPU settings a crashed dtpo process left changed on this machine.

Every dtpo command starts with :func:`restore_at_start`. A knob journal that cannot be read stops only the
commands that change knobs (they could not journal their own changes); the others go on with one warning.
"""

from __future__ import annotations

import logging
import sys

import typer

from dtpo.devices.journal import JournalError, KnobJournal, restore_pending

log = logging.getLogger(__name__)


def restore_at_start(changes_knobs: bool = False, journal: KnobJournal | None = None) -> None:
    """Restore what a killed dtpo process left changed (silent when nothing was).

    Args:
        changes_knobs: The command about to run changes GPU knobs (``train``/``bench`` with a power limit or
            clock, ``simulate`` with a sweep): an unusable journal then stops it.
        journal: The journal (default: this machine's).

    Raises:
        JournalError: The journal cannot be read or written and ``changes_knobs`` is true; the one-line
            message says how to inspect and clear it.
    """
    journal = journal or KnobJournal()
    try:
        restore_pending(journal, log=log.info)
    except JournalError:
        if changes_knobs:
            raise
        log.warning("the knob journal %s is unusable, so nothing a killed dtpo run left changed was restored; "
                    "`dtpo restore` says how to clear it", journal.path)


def restore_command() -> None:
    """Restore the original power limits and clocks of GPUs that a crashed dtpo run left changed.

    Exits 1 when a device could not be put back (it stays in the journal), so a script or a node's boot hook can
    tell; 0 when everything is back or nothing was left changed.
    """
    journal = KnobJournal()
    lines = restore_pending(journal)
    for line in lines:
        print(line)
    if not lines:
        print(f"nothing to restore ({journal.path} has no entries)")
    left = journal.entries()
    if left:
        print(f"{len(left)} device(s) stay changed; they stay in {journal.path} for the next `dtpo restore`",
              file=sys.stderr)
        raise typer.Exit(1)
