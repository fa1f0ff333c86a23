"""Knobs through a patched pynvml: journal first, then the change; restore; permission -> observe; bad values."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fakes import FakeNvml, FakeNvmlGpu

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import JournalError, KnobJournal, restore_pending
from dtpo.devices.knobs import KnobController
from dtpo.devices.nvml import NvmlGpu

UUID = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeNvmlGpu(UUID, model="NVIDIA A40", energy_mj=5_000, power_mw=250_000)],
                    journal_path=tmp_path / "journal.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def journal(tmp_path: Path) -> KnobJournal:
    return KnobJournal(tmp_path / "journal.json")


def changes(fake: FakeNvml) -> list[tuple]:
    return [c for c in fake.calls if c[0] != "get_limit"]


def test_limits_and_state_come_from_nvml(nvml: FakeNvml) -> None:
    gpu = NvmlGpu(0)
    limits = gpu.knob_limits()
    assert (limits.min_power_limit_w, limits.max_power_limit_w, limits.default_power_limit_w) == (100, 300, 300)
    assert limits.sm_clocks_mhz == (210, 1200, 1710, 1725, 1740)
    assert gpu.knob_state().power_limit_w == 300 and gpu.knob_key == f"nvml:{UUID}"


def test_journal_is_written_before_the_change_and_restore_undoes_it(nvml: FakeNvml, journal: KnobJournal) -> None:
    gpu = NvmlGpu(0)
    lines: list[str] = []
    with KnobController("apply", journal, log=lines.append) as knobs:
        assert knobs.set_power_limit(gpu, 200)
        assert knobs.lock_sm_clock(gpu, 1200)
        assert journal.original(gpu.knob_key).power_limit_w == 300
        assert (nvml.gpus[0].limit_mw, nvml.gpus[0].locked) == (200_000, (1200, 1200))
    assert changes(nvml) == [("set_limit", 200_000), ("lock", 1200, 1200), ("set_limit", 300_000), ("unlock",)]
    assert nvml.journal_seen_at_set[:2] == [True, True]  # journaled before each change
    assert not journal.path.exists()  # everything restored: nothing left to undo
    assert lines[-1].startswith("restored gpu0")


def test_restore_happens_on_an_exception(nvml: FakeNvml, journal: KnobJournal) -> None:
    gpu = NvmlGpu(0)
    with pytest.raises(RuntimeError), KnobController("apply", journal, log=lambda _: None) as knobs:
        knobs.set_power_limit(gpu, 150)
        raise RuntimeError("training crashed")
    assert nvml.gpus[0].limit_mw == 300_000 and not journal.path.exists()


@pytest.mark.parametrize("action, message", [
    (lambda k, g: k.set_power_limit(g, 90), "power limit 90 W is outside the range of gpu0 (NVIDIA A40): 100-300 W"),
    (lambda k, g: k.set_power_limit(g, 301), "outside the range"),
    (lambda k, g: k.lock_sm_clock(g, 1000), "SM clock 1000 MHz is not supported by gpu0 (NVIDIA A40); nearest "
                                            "supported: 1200 MHz, 1710 MHz"),
])
def test_bad_values_change_nothing(nvml: FakeNvml, journal: KnobJournal, action, message: str) -> None:
    gpu = NvmlGpu(0)
    with pytest.raises(ConfigError) as err:
        action(KnobController("apply", journal), gpu)
    assert message in str(err.value)
    assert changes(nvml) == [] and not journal.path.exists()


def test_no_permission_falls_back_to_observe(nvml: FakeNvml, journal: KnobJournal) -> None:
    nvml.deny = True
    gpu = NvmlGpu(0)
    lines: list[str] = []
    knobs = KnobController("apply", journal, log=lines.append)
    assert not knobs.set_power_limit(gpu, 200)
    assert knobs.mode == "observe"
    assert "Insufficient Permissions" in lines[0] and lines[0].endswith("continuing in observe mode")
    assert not journal.path.exists()
    nvml.deny = False
    assert not knobs.lock_sm_clock(gpu, 1200)  # observe mode: nothing more is attempted
    assert changes(nvml) == []


def test_dry_run_logs_and_touches_nothing(nvml: FakeNvml, journal: KnobJournal) -> None:
    lines: list[str] = []
    with KnobController("dry-run", journal, log=lines.append) as knobs:
        knobs.set_power_limit(NvmlGpu(0), 180)
    assert lines == ["dry run: would set gpu0 (NVIDIA A40) power limit 180 W"]
    assert changes(nvml) == [] and not journal.path.exists()


def test_a_journal_left_behind_is_restored_at_the_next_start(nvml: FakeNvml, journal: KnobJournal) -> None:
    gpu = NvmlGpu(0)
    KnobController("apply", journal, log=lambda _: None).set_power_limit(gpu, 120)  # then "crash": no restore
    assert nvml.gpus[0].limit_mw == 120_000 and journal.path.exists()
    lines = restore_pending(journal)
    assert nvml.gpus[0].limit_mw == 300_000 and nvml.gpus[0].locked is None
    assert not journal.path.exists()
    pid = os.getpid()
    assert lines == [f"restored gpu0 (NVIDIA A40) (left by pid {pid}): power limit 300 W, locked clocks reset"]


def test_a_corrupt_journal_is_a_clear_error(journal: KnobJournal) -> None:
    journal.path.write_text("{half a journ")
    with pytest.raises(JournalError, match="unreadable or corrupt"):
        restore_pending(journal)
    journal.path.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(JournalError, match="is not a dtpo journal"):
        journal.entries()
