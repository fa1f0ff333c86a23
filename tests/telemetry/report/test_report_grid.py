"""The grid-signal part of a run's report: the signal and what the run did over it, and the cost table."""

from __future__ import annotations

import re
from pathlib import Path

from test_report_html import figure_ids, make_run

from dtpo.core.record import RankRecord, RunRecord
from dtpo.core.record_sections import GridSection
from dtpo.telemetry.report.data import RunData
from dtpo.telemetry.report.html import render_report


def _segment(interval: int, start: str, phase: str, signal: float, seconds: float, limit: float | None = None,
             threshold: float | None = None) -> dict:
    segment = {"interval": interval, "start": f"2024-01-01T{start}:00+00:00", "phase": phase, "signal": signal,
               "power_limit_w": limit, "from_step": 0, "seconds": seconds, "energy_j": 10.0}
    if threshold is not None:
        segment["decision"] = {"done": 0.0, "threshold": threshold}
    return segment


def _run(tmp_path: Path, section: GridSection) -> RunData:
    record = RunRecord.load(make_run(tmp_path, energy=False, tuned=False))
    record.ranks = [RankRecord(0, 0, "host", "cpu", grid=section)]
    return RunData(tmp_path, record)


SIGNAL = {"source": "sig.csv (CSV)", "unit": "gCO2e/kWh", "kind": "carbon", "interval_s": 1800.0,
          "decided_on": "forecast", "replay": 3600.0, "start": "2024-01-01T00:10:00+00:00",
          "values_from": "2024-01-01T00:00:00+00:00", "values": [100.0, 400.0, 100.0]}
OUTCOME = {"finished_h": 1.3, "deadline_met": True, "energy_j": 40.0, "cost": 0.002, "cost_unit": "g CO2e",
           "energy_source": "the run's devices (measured)", "pauses": 1, "paused_h": 0.5, "paused_energy_j": 5.0,
           "estimated": {"cost": 0.001, "blind_cost": 0.002, "energy_j": 30.0, "blind_energy_j": 30.0,
                         "saving": 0.5, "blind_finished_h": 0.8, "note": "estimated: replayed"}}


def test_a_paused_run_draws_the_signal_and_its_pauses(tmp_path: Path) -> None:
    section = GridSection("pause", dict(SIGNAL), 2.0, [{"name": "running", "power_limit_w": None,
                                                        "time_per_sample_s": 1.0, "energy_per_sample_j": 0.1,
                                                        "steps": 5}], "measured",
                          [_segment(0, "00:10", "measure", 100.0, 600.0),
                           _segment(0, "00:20", "run", 100.0, 600.0, threshold=100.0),
                           _segment(1, "00:30", "paused", 400.0, 1800.0, threshold=100.0),
                           _segment(2, "01:00", "run", 100.0, 1200.0, threshold=100.0)], dict(OUTCOME), "",
                          {"samples": 100.0, "deadline_s": 7800.0, "interval_s": 1800.0})
    page = render_report([_run(tmp_path / "run", section)])
    assert "run-1-grid-plot" in figure_ids(page)
    shown = page[page.index('<figure id="run-1-grid-plot"'):]
    assert "grid signal over the run (sig.csv (CSV))" in shown and "paused" in shown and "running" in shown
    assert "threshold chosen" in shown and "deadline" in shown
    caption = re.search(r"<figcaption>(.*?)</figcaption>", shown, re.S).group(1)
    assert "running (blue) or paused (red)" in caption
    assert "paused 1 time for 0.5 h" in page and "+50.0 % saved by the schedule" in page
    assert "signal-blind (estimate)" in page


def test_a_throttled_run_draws_its_power_limits(tmp_path: Path) -> None:
    section = GridSection("throttle", dict(SIGNAL), 2.0, [], "simulated",
                          [_segment(0, "00:10", "sweep", 100.0, 600.0, limit=300.0),
                           _segment(0, "00:20", "throttle", 100.0, 600.0, limit=300.0),
                           _segment(1, "00:30", "throttle", 400.0, 1800.0, limit=150.0)], dict(OUTCOME), "")
    page = render_report([_run(tmp_path / "run", section)])
    shown = page[page.index('<figure id="run-1-grid-plot"'):]
    assert "power limit (W)" in shown and "the power limit held in each stretch" in shown
    assert "simulated" in page[page.index('id="run-1-grid"'):page.index('<figure id="run-1-grid-plot"')]


def test_no_grid_part_without_a_grid_signal(tmp_path: Path) -> None:
    record = RunRecord.load(make_run(tmp_path / "run", energy=False, tuned=False))
    assert "run-1-grid-plot" not in figure_ids(render_report([RunData(tmp_path / "run", record)]))
