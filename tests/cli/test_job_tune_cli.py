"""``dtpo train --tune precision,grad-accum,compression``: bad requests are one line and exit 2 before anything
trains; a short tuned run prints its candidates table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import run_cli as run

BAD = [
    (["--tune", "precision,speed"], "unknown knob 'speed'"),
    (["--tune", "precision,,compression"], "unknown knob ''"),
    (["--tune", "compression,compression"], "names a knob twice"),
    (["--tune", "power-limit,precision"], "cannot combine power-limit with job knobs yet"),
    (["--tune", "precision", "--allow-batch-change"], "only meaningful with --tune grad-accum"),
    (["--tune", "compression", "--workers", "1"], "--tune compression needs DDP on 2 or more workers"),
    (["--tune", "compression", "--strategy", "fsdp"], "--tune compression needs DDP on 2 or more workers"),
    (["--tune", "compression", "--powersgd-rank", "0"], "session.powersgd_rank must be"),
    (["--tune", "precision", "--guard-cosine", "1.5"], "tune.guard_cosine must be"),
    (["--tune", "precision", "--guard-loss-rise", "-1"], "tune.guard_loss_rise must be positive"),
    (["--tune", "grad-accum", "--cost", "bogus"], "unknown cost metric 'bogus'"),
    (["--tune", "grad-accum", "--no-energy"], "needs energy measured: drop --no-energy, or tune for --cost time"),
]


@pytest.mark.parametrize(("args", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_job_tuning_requests_are_one_line_and_exit_2(args: list[str], message: str, state: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["train", "--workload", "mlp", "--steps", "5", *args], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], err
    assert "Traceback" not in out + err
    assert not list(tmp_path.iterdir())  # nothing trained, no run folder


def test_a_precision_the_device_cannot_run_is_refused_before_training(state: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    code, out, err = run(["train", "--workload", "mlp", "--steps", "5", "--tune", "grad-accum",
                          "--precision", "16-mixed"], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "precision 16-mixed needs autocast" in lines[0], err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_tuned_train_run_prints_the_candidates_and_records_the_choice(state: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code, out, err = run(["train", "--workload", "mlp", "--steps", "60", "--batch-size", "32", "--run-dir",
                          str(run_dir), "--tune", "grad-accum,compression", "--cost", "energy"], capsys)
    assert code == 0, out + err
    assert "job knobs tuned for energy per sample" in out
    for column in ("setting", "samples/s", "J/sample (est.)", "comm share", "guard", "outcome"):
        assert column in out
    assert "job tuning" in out
    record = json.loads((run_dir / "record.json").read_text())
    report = record["ranks"][0]["tuning"]
    assert report["kind"] == "job" and report["settings"]
    assert record["config"]["tune"]["knob"] == "grad-accum,compression"


def test_bench_drops_the_compression_knob_on_one_worker_only() -> None:
    from dtpo.cli.bench import for_worker_count
    from dtpo.core.config import RunConfig, TuneConfig

    config = RunConfig(tune=TuneConfig(knob="grad-accum,compression", allow_batch_change=True))
    one, two = for_worker_count(config, 1), for_worker_count(config, 2)
    assert one.tune.job_knobs == ("grad-accum",) and one.tune.allow_batch_change and one.launch.workers == 1
    assert two.tune.job_knobs == ("grad-accum", "compression") and two.launch.workers == 2
    alone = for_worker_count(RunConfig(tune=TuneConfig(knob="compression")), 1)
    assert alone.tune.knob is None  # nothing left to tune on one worker: an untuned run
