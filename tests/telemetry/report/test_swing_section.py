"""The power-swing part of the HTML report: drawn for a simulated job (labelled simulated) and for a modelled
run (labelled estimated, with the bands it cannot see), one line where a timeline is too short to analyse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.simulation.job import JobConfig
from dtpo.simulation.power_phases import StepPhases, simulate_phases
from dtpo.telemetry.report.html import build_report
from dtpo.telemetry.trace import TIMELINE_START, power_timeline_path

T0 = 1_800_000_000.0


def modelled_run(folder: Path, samples: int) -> Path:
    steps = [StepRecord(step=i, warmup=False, samples=8, step_s=0.5, data_wait_s=0.0, compute_s=0.4, tail_s=0.1,
                        optimizer_s=0.0, started_at=T0 + 0.5 * i) for i in range(20)]
    rank = RankRecord(0, 0, "host", "cpu", steps=steps)
    rank.energy = {TIMELINE_START: T0, "devices": [{"name": "cpu (modelled)", "kind": "cpu", "source": "modelled",
                                                    "estimated": True}]}
    path = power_timeline_path(folder, 0)
    path.parent.mkdir(parents=True)
    path.write_text("t_s,cpu (modelled) [W]\n" + "".join(f"{0.1 * i:.3f},{8 + 2 * ((i // 4) % 2)}\n"
                                                           for i in range(samples)))
    RunRecord(run_id=folder.name, status="completed", started_at="now", ranks=[rank]).save(folder)
    return folder


def swing_part(page: str) -> str:
    """The page from the swing heading to the next section."""
    start = page.index('id="run-1-swing"')
    return page[start:page.index("<h3", start + 1) if "<h3" in page[start + 1:] else len(page)]


def test_a_simulated_job_gets_its_swing_figure_and_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    run = simulate_phases(JobConfig(gpu="H100-SXM", workload="resnet50", gpus=2, steps=25, batch_size=2048),
                          StepPhases(sample_hz=50.0))
    page = build_report([run.write_run(tmp_path / "sim")])
    part = swing_part(page)
    assert re.search(r'<figure id="run-1-swing-plot" class="plot"><svg\b', part)
    assert 'class="badge sim">simulated<' in part
    for text in ("ramp limiter (GB200-like)", "energy buffer (GB300-like)", "fill communication gaps",
                 "at the step rate", "At 10,000 GPUs"):
        assert text in part
    assert "<script" not in page.lower()


def test_a_modelled_run_is_labelled_estimated_and_names_what_it_cannot_see(tmp_path: Path) -> None:
    part = swing_part(build_report([modelled_run(tmp_path / "cpu", samples=100)]))
    assert 'class="badge est">estimated<' in part
    assert "not seen" in part and "7-20 Hz" in part


def test_a_timeline_too_short_to_analyse_is_one_line(tmp_path: Path) -> None:
    page = build_report([modelled_run(tmp_path / "short", samples=5)])
    assert "Power swing not analysed" in page and 'id="run-1-swing"' not in page
