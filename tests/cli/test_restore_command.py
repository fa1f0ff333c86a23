"""dtpo restore, and the journal check every dtpo command starts with."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.cli.restore import restore_at_start
from dtpo.devices.journal import JournalError, KnobJournal


def run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtpo_cli(*args), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DTPO_STATE_DIR": str(state)})


@pytest.mark.slow
def test_nothing_to_restore(tmp_path: Path) -> None:
    result = run(["restore"], tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("nothing to restore")


@pytest.mark.slow
def test_a_corrupt_journal_stops_restore_with_one_line_saying_how_to_clear_it(tmp_path: Path) -> None:
    journal = tmp_path / "knobs-journal.json"
    journal.write_text("{not json")
    result = run(["restore"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: the knob journal")
    assert "is unreadable or corrupt" in lines[0]
    assert f"cat {journal}" in lines[0] and f"rm {journal}" in lines[0]
    assert journal.read_text() == "{not json"  # left for the user to inspect


@pytest.mark.slow
def test_a_corrupt_journal_does_not_block_commands_that_change_no_knobs(tmp_path: Path) -> None:
    (tmp_path / "knobs-journal.json").write_text("{not json")
    result = run(["monitor", "--duration", "0.2", "--interval", "0.1", "--cpu-tdp", "30"], tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "knob journal" in line]
    assert len(warnings) == 1 and "dtpo restore" in warnings[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("content", ["{not json", '{"schema": "other"}',
                                     '{"schema": "dtpo.knobs-journal/1", "entries": {"nvml:x": {"original": 5}}}'])
def test_restore_at_start_refuses_only_commands_that_change_knobs(tmp_path: Path, content: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    journal = KnobJournal(tmp_path / "knobs-journal.json")
    journal.path.write_text(content)
    with pytest.raises(JournalError, match="inspect it .*then remove it"):
        restore_at_start(changes_knobs=True, journal=journal)
    with caplog.at_level(logging.WARNING, logger="dtpo"):
        restore_at_start(changes_knobs=False, journal=journal)
    assert any("is unusable" in r.getMessage() for r in caplog.records)
    assert journal.path.read_text() == content


def test_restore_at_start_restores_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = KnobJournal(tmp_path / "knobs-journal.json")
    restore_at_start(changes_knobs=True, journal=journal)  # no journal: silent
    assert not journal.path.exists()
