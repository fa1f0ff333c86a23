"""Each window's entry in the energy section is the window's measurement as ``to_dict`` gives it, after its steps,
whether every device was read or one was lost; the window itself gets its own copies."""

from __future__ import annotations

from types import SimpleNamespace

from fakes import FakeGpu

from dtpo.core.record import RankRecord
from dtpo.core.steps import Window
from dtpo.devices.base import DeviceError
from dtpo.devices.discovery import Discovery
from dtpo.session.callbacks.energy import CURRENT_WINDOW, EnergyCallback


class CountingGpu(FakeGpu):
    """A GPU whose energy counter the test moves, and that can stop answering."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.joules = 0.0
        self.broken = False

    def energy_j(self) -> float:
        if self.broken:
            raise DeviceError("gone")
        return self.joules


def test_window_entries_are_the_measurement_after_the_steps() -> None:
    gpus = [CountingGpu("gpu0"), CountingGpu("gpu1")]
    energy = EnergyCallback(Discovery(list(gpus)), warmup_steps=0, sample_interval_s=None)
    rank = RankRecord(rank=0, local_rank=0, node="n", device="cpu")
    session = SimpleNamespace(start_step=0, rank_record=rank)
    energy.on_step_begin(session, 0)
    for index, (a, b) in enumerate([(10.0, 4.0), (25.0, 9.0)]):
        gpus[0].joules, gpus[1].joules = a, b
        gpus[1].broken = index == 1  # the second window loses a device
        window = Window(index, index, index, 0.01, 8, 0.01)
        start = energy._boundary
        assert start is not None
        energy.on_window_end(session, window)
        entry = energy.windows[-1]
        expected = energy.monitor.measure(CURRENT_WINDOW, start, energy._boundary).to_dict()
        assert list(entry) == ["first_step", "last_step", *expected]
        assert {k: v for k, v in entry.items() if k not in ("first_step", "last_step")} == expected
        assert window.energy_j == entry["energy_j"] and window.energy_j is not entry["energy_j"]
        assert window.sources == entry["sources"] and window.estimated == entry["estimated"]
    first, second = energy.windows
    assert first["energy_j"] == {gpus[0].info.name: 10.0, gpus[1].info.name: 4.0} and first["lost"] == []
    assert second["energy_j"] == {gpus[0].info.name: 15.0} and second["lost"] == [gpus[1].info.name]
    assert second["sources"] == {gpus[0].info.name: gpus[0].info.source}
    assert rank.energy is not None and rank.energy["windows"] is energy.windows  # the live section, set once
    energy.close()


def test_the_run_window_opens_at_the_first_measured_step_and_then_step_begins_are_not_needed() -> None:
    energy = EnergyCallback(Discovery([CountingGpu("gpu0")]), warmup_steps=2, sample_interval_s=None)
    session = SimpleNamespace(start_step=0)
    assert not energy.on_step_begin(session, 0) and not energy.on_step_begin(session, 1)  # warm-up: still needed
    assert energy._boundary is None
    assert energy.on_step_begin(session, 2)  # opened: the stream may stop calling it
    assert energy._boundary is not None
    boundary = energy._boundary
    assert energy.on_step_begin(session, 3) and energy._boundary is boundary  # a later call changes nothing
    energy.close()
