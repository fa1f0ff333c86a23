"""Knobs through a patched pynvml: journal first, then the change; restore; permission -> observe; bad values."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import JournalError, KnobJournal, restore_pending
from dtpo.devices.knobs import KnobController
from dtpo.devices.nvml import NvmlGpu

UUID = "GPU-11111111-2222-3333-4444-555555555555"


class NVMLError(Exception):
    pass


class NVMLError_NoPermission(NVMLError):  # noqa: N801 - pynvml's name
    def __str__(self) -> str:
        return "Insufficient Permissions"


class FakeNvml(types.ModuleType):
    """One GPU with power-limit and clock knobs; every call is logged in order."""

    NVMLError = NVMLError
    NVMLError_NoPermission = NVMLError_NoPermission

    def __init__(self, journal_path: Path) -> None:
        super().__init__("pynvml")
        self.calls: list[tuple] = []
        self.limit_mw = 300_000
        self.locked: tuple[int, int] | None = None
        self.deny = False
        self.journal_path = journal_path
        self.journal_seen_at_set: list[bool] = []

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return "h0"
    def nvmlDeviceGetUUID(self, h: str) -> str: return UUID
    def nvmlDeviceGetName(self, h: str) -> str: return "NVIDIA A40"
    def nvmlDeviceGetMigMode(self, h: str) -> tuple[int, int]: return (0, 0)
    def nvmlDeviceGetTotalEnergyConsumption(self, h: str) -> int: return 5_000
    def nvmlDeviceGetPowerUsage(self, h: str) -> int: return 250_000
    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: str) -> tuple[int, int]: return (100_000, 300_000)
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: str) -> int: return 300_000
    def nvmlDeviceGetSupportedMemoryClocks(self, h: str) -> list[int]: return [7251, 405]
    def nvmlDeviceGetSupportedGraphicsClocks(self, h: str, mem: int) -> list[int]:
        return [1740, 1725, 1710, 1200, 210] if mem == 7251 else [210]

    def nvmlDeviceGetPowerManagementLimit(self, h: str) -> int:
        self.calls.append(("get_limit",))
        return self.limit_mw

    def _change(self, *call: object) -> None:
        if self.deny:
            raise NVMLError_NoPermission()
        self.journal_seen_at_set.append(self.journal_path.exists())
        self.calls.append(call)

    def nvmlDeviceSetPowerManagementLimit(self, h: str, mw: int) -> None:
        self._change("set_limit", mw)
        self.limit_mw = mw

    def nvmlDeviceSetGpuLockedClocks(self, h: str, lo: int, hi: int) -> None:
        self._change("lock", lo, hi)
        self.locked = (lo, hi)

    def nvmlDeviceResetGpuLockedClocks(self, h: str) -> None:
        self._change("unlock")
        self.locked = None


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(tmp_path / "journal.json")
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
        assert (nvml.limit_mw, nvml.locked) == (200_000, (1200, 1200))
    assert changes(nvml) == [("set_limit", 200_000), ("lock", 1200, 1200), ("set_limit", 300_000), ("unlock",)]
    assert nvml.journal_seen_at_set[:2] == [True, True]  # journaled before each change
    assert not journal.path.exists()  # everything restored: nothing left to undo
    assert lines[-1].startswith("restored gpu0")


def test_restore_happens_on_an_exception(nvml: FakeNvml, journal: KnobJournal) -> None:
    gpu = NvmlGpu(0)
    with pytest.raises(RuntimeError), KnobController("apply", journal, log=lambda _: None) as knobs:
        knobs.set_power_limit(gpu, 150)
        raise RuntimeError("training crashed")
    assert nvml.limit_mw == 300_000 and not journal.path.exists()


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
    assert nvml.limit_mw == 120_000 and journal.path.exists()
    lines = restore_pending(journal)
    assert nvml.limit_mw == 300_000 and nvml.locked is None
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
