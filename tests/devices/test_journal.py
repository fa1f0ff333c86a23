"""The knob journal: entries written before a change, validated when read, and one clear line when unusable."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dtpo.devices.base import DeviceError, KnobState
from dtpo.devices.journal import JOURNAL_SCHEMA, JournalError, KnobJournal, restore_pending


class Gpu:
    """Just enough of a Device for the journal: a key, a name, knob state and setters."""

    def __init__(self, key: str, limit: float = 300.0) -> None:
        self.knob_key = key
        self.info = SimpleNamespace(name=f"gpu {key}")
        self.state = KnobState(limit, None)
        self.closed = False

    def knob_state(self) -> KnobState:
        return self.state

    def set_power_limit(self, watts: float) -> None:
        self.state = KnobState(watts, self.state.locked_sm_clocks_mhz)

    def lock_sm_clocks(self, low: int, high: int) -> None:
        self.state = KnobState(self.state.power_limit_w, (low, high))

    def unlock_sm_clocks(self) -> None:
        self.state = KnobState(self.state.power_limit_w, None)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def journal(tmp_path: Path) -> KnobJournal:
    return KnobJournal(tmp_path / "knobs-journal.json")


def test_the_first_original_wins_and_forget_removes_the_file(journal: KnobJournal) -> None:
    gpu = Gpu("sim:/tmp/a")
    assert journal.remember(gpu) is True
    gpu.set_power_limit(200.0)
    assert journal.remember(gpu) is False
    assert journal.original("sim:/tmp/a") == KnobState(300.0, None)
    journal.forget("sim:/tmp/a")
    assert not journal.path.exists() and journal.entries() == {}


def test_restore_pending_puts_devices_back_and_keeps_what_it_cannot(journal: KnobJournal) -> None:
    good, bad = Gpu("sim:/good"), Gpu("nvml:gone")
    journal.remember(good)
    journal.remember(bad)
    good.set_power_limit(150.0)
    good.lock_sm_clocks(900, 900)

    def opener(key: str) -> Gpu:
        if key == "nvml:gone":
            raise DeviceError("no such GPU")
        return good

    lines = restore_pending(journal, opener=opener)
    assert good.state == KnobState(300.0, None) and good.closed
    assert any(line.startswith("restored gpu sim:/good") for line in lines)
    assert any("could not restore gpu nvml:gone: no such GPU" in line for line in lines)
    assert list(journal.entries()) == ["nvml:gone"]


@pytest.mark.parametrize("content, why", [
    ("{not json", "is unreadable or corrupt"),
    (b"\xff\xfe\x00", "is unreadable or corrupt"),
    ("[]", "is not a dtpo journal"),
    (json.dumps({"schema": "dtpo.knobs-journal/0", "entries": {}}), "is not a dtpo journal"),
    (json.dumps({"schema": JOURNAL_SCHEMA, "entries": {"nvml:x": {"device": "gpu"}}}), "its entry 'nvml:x'"),
    (json.dumps({"schema": JOURNAL_SCHEMA, "entries": {"nvml:x": {"original": {"power_limit_w": "300"}}}}),
     "its entry 'nvml:x'"),
    (json.dumps({"schema": JOURNAL_SCHEMA, "entries": {"nvml:x": {"original": {
        "power_limit_w": 300, "locked_sm_clocks_mhz": [1]}}}}), "its entry 'nvml:x'"),
])
def test_an_unusable_journal_is_one_line_that_says_how_to_inspect_and_clear_it(journal: KnobJournal,
                                                                                 content: str | bytes,
                                                                                 why: str) -> None:
    if isinstance(content, bytes):
        journal.path.write_bytes(content)
    else:
        journal.path.write_text(content)
    with pytest.raises(JournalError) as info:
        journal.entries()
    message = str(info.value)
    assert "\n" not in message and why in message
    assert f"cat {journal.path}" in message and f"rm {journal.path}" in message
    with pytest.raises(JournalError):
        restore_pending(journal, opener=lambda key: Gpu(key))
    with pytest.raises(JournalError):
        journal.remember(Gpu("nvml:y"))  # a command that changes knobs cannot journal into it either
    assert journal.path.exists()  # left for the user to inspect


def test_a_journal_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    journal = KnobJournal(tmp_path / "dir")  # a directory where the file should be
    with pytest.raises(JournalError, match="is unreadable or corrupt"):
        journal.entries()


def test_a_valid_entry_with_locked_clocks_reads_back(journal: KnobJournal) -> None:
    gpu = Gpu("sim:/c")
    gpu.lock_sm_clocks(1410, 1410)
    journal.remember(gpu)
    assert journal.original("sim:/c") == KnobState(300.0, (1410, 1410))


def _remember_many(path: str, rank: int, rounds: int) -> None:
    journal = KnobJournal(Path(path))
    for i in range(rounds):
        journal.remember(Gpu(f"nvml:GPU-{rank}-{i}"))


@pytest.mark.slow
def test_ranks_journaling_at_once_keep_every_entry(tmp_path: Path) -> None:
    # the ranks of a node share one journal: without a lock, a rank's rewrite drops another's fresh entry, and
    # that rank later journals its tuned limit as the "original" (found on virtual GPUs: restored to 275 W)
    import multiprocessing

    path = tmp_path / "knobs-journal.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_remember_many, args=(str(path), rank, 25)) for rank in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert len(KnobJournal(path).entries()) == 4 * 25


def test_the_folder_it_makes_is_private(tmp_path: Path) -> None:
    journal = KnobJournal(tmp_path / "state" / "knobs-journal.json")
    journal.remember(Gpu("nvml:GPU-a"))
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("loosen", ["folder", "journal"])
def test_a_journal_others_can_change_is_refused_in_one_line(loosen: str, tmp_path: Path) -> None:
    folder = tmp_path / "state"
    journal = KnobJournal(folder / "knobs-journal.json")
    journal.remember(Gpu("nvml:GPU-a"))
    target = folder if loosen == "folder" else journal.path
    target.chmod(target.stat().st_mode | 0o002)
    with pytest.raises(JournalError, match=f"refusing the knob journal .*: {target} is writable by others, so "
                                           "another user could make dtpo set any power limit") as refused:
        journal.entries()
    assert "chmod 700" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(JournalError, match="refusing the knob journal"):
        restore_pending(journal, opener=lambda key: Gpu(key))


def test_a_journal_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    import os

    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    path = folder / "knobs-journal.json"
    path.write_text(json.dumps({"schema": JOURNAL_SCHEMA, "entries": {
        "nvml:GPU-a": {"device": "gpu0", "original": {"power_limit_w": 100.0, "locked_sm_clocks_mhz": None}}}}))
    try:
        os.chown(path, 54321, -1)
    except PermissionError:
        pytest.skip("only root can give a file to another user")
    restored: list[str] = []
    with pytest.raises(JournalError, match="belongs to another user"):
        restore_pending(KnobJournal(path), opener=lambda key: restored.append(key) or Gpu(key))
    assert restored == []  # no GPU was opened, let alone set
