"""``dtpo train`` / ``dtpo bench``: bad input is one line and exit 2 before anything starts; a run's config
is data that reproduces it; interrupts leave a merged record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.cli.app import main
from dtpo.core.config import RunConfig
from dtpo.core.record import RunRecord

BAD_INPUTS = [
    (["train", "--grad-accum", "0"], "session.grad_accum must be >= 1, got 0 (--grad-accum)"),
    (["train", "--lr", "nan"], "workload.lr must be a finite number"),
    (["train", "--lr", "inf"], "workload.lr must be a finite number"),
    (["train", "--cpu-tdp", "nan"], "energy.cpu_tdp_w must be a finite number"),
    (["train", "--grid-intensity", "nan"], "energy.grid_g_per_kwh must be a finite number"),
    (["train", "--power-limit", "inf"], "knobs.power_limit_w must be a finite number"),
    (["train", "--sm-clock", "99999999999999999999"], "knobs.sm_clock_mhz must be <="),
    (["train", "--steps", "2"], "warm-up"),
    (["train", "--steps", "999999999999999999999"], "workload.steps must be <="),
    (["train", "--seed", "-1"], "workload.seed must be >= 0"),
    (["train", "--seed", "99999999999999999999"], "workload.seed must be <="),
    (["train", "--batch-size", "1000000000"], "workload.batch_size must be <="),
    (["train", "--workers", "0"], "launch.workers must be >= 1"),
    (["train", "--workload", "foo"], "unknown workload 'foo'"),
    (["train", "--precision", "fp8"], "session.precision must be one of"),
    (["train", "--compression", "zip"], "session.compression must be one of"),
    (["train", "--run-dir", ""], "run_dir must name a directory"),
    (["train", "--config", "missing.json"], "no configuration file at missing.json"),
    (["train", "--threads-per-worker", "0"], "launch.threads_per_worker must be >= 1"),
    (["train", "--steps", "abc"], "Invalid value for '--steps'"),
    (["train", "--tune", "rebalance", "--workers", "1"],
     "--tune rebalance moves samples between ranks: it needs --workers 2 or more"),
    (["train", "--tune", "rebalance", "--workers", "2", "--strategy", "fsdp"], "FSDP shards the model"),
    (["train", "--tune", "rebalance", "--workers", "2", "--rebalance-max-share", "0.9"], "must be at least 1"),
    (["bench", "--workers", "1,,2"], "--workers must be a comma-separated list"),
    (["bench", "--workers", "a"], "--workers must be a comma-separated list"),
    (["bench", "--workers", "0,1"], "--workers counts must be between 1 and"),
    (["bench", "--steps", "2"], "warm-up"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(argv: list[str], message: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: "), err
    assert message in lines[0]
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_holding_a_record_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "record.json").write_text('{"keep": "me"}')
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--overwrite" in capsys.readouterr().err
    assert json.loads((tmp_path / "record.json").read_text()) == {"keep": "me"}


def test_a_run_dir_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--run-dir", str(tmp_path / "file" / "run")])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_no_arguments_prints_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    out = capsys.readouterr()
    assert exit_info.value.code == 0
    assert "Usage: dtpo" in out.out and "error" not in out.err


def test_version_and_short_help(capsys: pytest.CaptureFixture[str]) -> None:
    import dtpo

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"dtpo {dtpo.__version__}"
    for command in ("train", "bench", "monitor", "simulate", "restore"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "-h"])
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and "Usage: dtpo" in out, command
        assert "<bool>" not in out, command


@pytest.mark.slow
def test_the_config_is_data_from_cli_to_worker_to_record_and_reproduces_the_run(tmp_path: Path) -> None:
    first = tmp_path / "first"
    common = ["--workers", "1", "--no-energy", "--no-count-flops", "--warmup-steps", "1"]
    result = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--steps", "4", "--batch-size", "8",
                                     "--grad-accum", "2", "--seed", "5", "--lr", "0.01", "--run-dir", str(first),
                                     *common), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    written = RunConfig.load(first / "config.json")
    record = RunRecord.load(first)
    assert (written.workload.name, written.workload.steps, written.workload.batch_size) == ("mlp", 4, 8)
    assert written.session.grad_accum == 2 and written.workload.seed == 5 and written.workload.lr == 0.01
    assert written.launch.threads_per_worker >= 1
    # What the worker ran with is what the CLI resolved: the record holds the same tree.
    recorded = {k: v for k, v in record.config.items() if k in ("workload", "session", "energy", "knobs", "launch")}
    assert RunConfig.from_dict(recorded) == written
    assert [s.samples for s in record.ranks[0].steps] == [16] * 4  # 2 micro-batches of 8
    assert sorted(p.name for p in (first / "trace").iterdir()) == ["merged.json", "rank00000.json"]
    # --config reproduces it; a flag typed on the command line overrides the file.
    second = tmp_path / "second"
    result = subprocess.run(dtpo_cli("train", "--config", str(first / "config.json"), "--steps", "5",
                                     "--run-dir", str(second)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    again = RunConfig.load(second / "config.json")
    assert again.workload.steps == 5
    assert again.replace(workload={"steps": 4}, launch={"run_dir": None}) == written.replace(launch={"run_dir": None})


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_ends_in_one_line_and_a_merged_interrupted_record(tmp_path: Path, signum: int,
                                                                       code: int) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "100000",
                                     "--warmup-steps", "1", "--run-dir", str(run_dir)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(run_dir / "ranks" / "rank00001.json", 120)
        time.sleep(0.5)
        # Ctrl-C reaches the whole process group; a scheduler's SIGTERM only the launcher.
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("dtpo: interrupted"), err
    record = RunRecord.load(run_dir)
    assert record.status == "interrupted"
    assert len(record.ranks) == 2 and all(r.steps for r in record.ranks)
    assert (run_dir / "trace" / "merged.json").is_file()  # an interrupted run's trace is written from its partials


@pytest.mark.parametrize("argv, expected", [
    (["train"], False),
    (["train", "--power-limit", "250"], True),
    (["train", "--power-limit=250"], True),
    (["train", "--sm-clock", "1410", "--dry-run"], False),
    (["train", "--power-limit", "250", "--knob-mode", "observe"], False),
    (["bench", "--config", "x.json"], True),
    (["simulate", "--list"], False),
    (["simulate", "--sweep", "power-limit"], True),
    (["simulate", "sweep", "power-limit"], True),
    (["simulate", "tune", "both"], True),
    (["simulate", "stragglers", "--straggler", "1:1.2"], True),
    (["simulate", "run", "--power-limit", "200"], True),
    (["simulate", "run"], False),
    (["simulate", "list"], False),
    (["monitor"], False),
    (["launch", "x.py"], False),
])
def test_only_commands_that_change_knobs_need_a_readable_journal(argv: list[str], expected: bool) -> None:
    from dtpo.cli.app import changes_knobs

    assert changes_knobs(argv[0], argv) is expected
