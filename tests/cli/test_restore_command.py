"""dtpo restore, and the journal check every dtpo command starts with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import dtpo_cli


def run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtpo_cli(*args), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DTPO_STATE_DIR": str(state)})


def test_nothing_to_restore(tmp_path: Path) -> None:
    result = run(["restore"], tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("nothing to restore")


def test_a_corrupt_journal_stops_every_command_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "knobs-journal.json").write_text("{not json")
    for args in (["restore"], ["monitor", "--duration", "0.2"]):
        result = run(args, tmp_path)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "is unreadable or corrupt" in lines[0] and lines[0].startswith("dtpo: error:")
