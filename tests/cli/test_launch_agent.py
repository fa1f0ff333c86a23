"""``dtpo launch`` on scripts that know nothing of dtpo: measured by the agent, and every bad input in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import dtpo_cli
from fakes import FakeNvml

from dtpo.cli.app import main
from dtpo.core.record import RunRecord
from dtpo.telemetry.store.database import RunStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "unmodified_ddp.py"


def _launch(tmp_path: Path, *argv: str, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(dtpo_cli("launch", "--standalone", *argv), capture_output=True, text=True, cwd=tmp_path,
                          timeout=timeout, env=environ)


@pytest.mark.slow
def test_an_unmodified_ddp_script_is_measured_per_step(tmp_path: Path) -> None:
    result = _launch(tmp_path, "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"), str(EXAMPLE),
                     "--epochs", "2", "--samples", "512", "--eval-every", "3", "--counts", str(tmp_path / "counts"))
    assert result.returncode == 0, result.stderr
    assert "communication overhead" in result.stdout and "energy per sample" in result.stdout
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed" and [r.rank for r in record.ranks] == [0, 1]
    for rank in record.ranks:  # the agent's counts are the script's own, exactly
        own = json.loads((tmp_path / f"counts.{rank.rank}").read_text())
        assert len(rank.steps) == own["steps"] == 16
        assert sum(s.samples for s in rank.steps) == own["samples"]
        measured = [s for s in rank.steps if not s.warmup]
        assert all(s.tail_s is not None and s.compute_s > 0 for s in measured)  # DDP's gradient-ready stamps
    assert record.config["session"]["strategy"] == "ddp"
    assert record.config["user"]["script"] == "unmodified_ddp.py"
    assert record.totals["samples"]["value"] == sum(s.samples for r in record.ranks for s in r.steps if not s.warmup)
    assert (tmp_path / "run" / "report.html").is_file()
    assert any(row.name == record.run_id and row.status == "completed" for row in RunStore.open(None).list_runs())


@pytest.mark.slow
def test_with_no_agent_the_script_runs_unmeasured(tmp_path: Path) -> None:
    result = _launch(tmp_path, "--nproc-per-node", "1", "--no-agent", str(EXAMPLE), "--epochs", "1",
                     "--samples", "64")
    assert result.returncode == 0, result.stderr
    assert "trained 2 steps" in result.stdout
    assert "nothing was recorded" in result.stderr and "--no-agent" in result.stderr
    assert not (tmp_path / "runs").exists()


SCRIPTS = {
    "crash_at_import": "import torch\nraise ZeroDivisionError('the script divided by zero')\n",
    "inference": textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 2)
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(8, 4))
    """),
    "fails_midway": textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x,) in enumerate(DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=8)):
            model(x).sum().backward()
            opt.step()
            if i == 5:
                raise ValueError("bad label 7 in batch 5")
    """),
}


def _script(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(SCRIPTS[name])
    return str(path)


@pytest.mark.slow
def test_a_script_that_crashes_at_import_shows_its_own_error(tmp_path: Path) -> None:
    result = _launch(tmp_path, "--nproc-per-node", "1", _script(tmp_path, "crash_at_import"))
    assert result.returncode == 1
    assert "ZeroDivisionError: the script divided by zero" in result.stderr  # the user's traceback, as the user's
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("dtpo: run failed: rank 0 exited with code 1") and "nothing was recorded" in last
    assert "dtpo/agent" not in result.stderr  # nothing of the agent in the user's traceback


@pytest.mark.slow
def test_a_script_with_no_optimizer_says_there_was_nothing_to_measure(tmp_path: Path) -> None:
    result = _launch(tmp_path, "--nproc-per-node", "1", _script(tmp_path, "inference"))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "never stepped a torch optimizer" in lines[0], result.stderr


@pytest.mark.slow
def test_a_script_that_fails_midway_keeps_its_steps_and_its_own_error(tmp_path: Path) -> None:
    result = _launch(tmp_path, "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"),
                     _script(tmp_path, "fails_midway"))
    assert result.returncode == 1
    assert "ValueError: bad label 7 in batch 5" in result.stderr
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "failed" and record.error == "ValueError: bad label 7 in batch 5"
    assert len(record.ranks[0].steps) == 6 and sum(s.samples for s in record.ranks[0].steps) == 48


@pytest.mark.slow
def test_a_user_sitecustomize_still_runs_and_its_error_is_its_own(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    script = tmp_path / "check.py"
    script.write_text("import os, torch\nassert os.environ.get('USER_SITE_RAN') == '1'\n"
                      "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(4):\n    m(torch.randn(3, 2)).sum().backward(); o.step()\n")
    ok = _launch(tmp_path, "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"), str(script),
                 env={"PYTHONPATH": str(site)})
    assert ok.returncode == 0, ok.stderr
    assert len(RunRecord.load(tmp_path / "run").ranks[0].steps) == 4  # the agent ran, and so did the user's
    (site / "sitecustomize.py").write_text("raise RuntimeError('proxy settings missing')\n")
    script.write_text("print('script ran')\n")
    broken = _launch(tmp_path, "--nproc-per-node", "1", str(script), env={"PYTHONPATH": str(site)})
    assert broken.returncode == 0 and "script ran" in broken.stdout
    # the worker's line (the launcher's own Python also read the user's PYTHONPATH, and says so in its words)
    line = next(line for line in broken.stderr.splitlines() if "your sitecustomize" in line)
    assert "RuntimeError: proxy settings missing" in line and "not dtpo's" in line


@pytest.mark.parametrize(("argv", "env", "words"), [
    (["--tune", "precision"], {}, "change the script's numerics"),
    (["--tune", "fast"], {}, "--tune must be one of"),
    (["--tune", "rebalance"], {}, "an unmodified script's loader cannot do"),
    (["--tune", "stragglers,rebalance"], {}, "an unmodified script's loader cannot do"),
    (["--no-agent", "--tune", "power-limit"], {}, "--tune needs the agent"),
    (["--cost", "energy"], {}, "--cost and --knob-mode go with --tune"),
    (["--no-agent", "--metrics-addr", "9999"], {}, "--metrics-addr needs the agent"),
    (["--tune", "power-limit", "--cost", "joules"], {}, "joules"),
    ([], {"DTPO_SAMPLES_PER_STEP": "lots"}, "DTPO_SAMPLES_PER_STEP must be a positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str],
                                          words: str) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as ended:
        main(["launch", "--standalone", "--nproc-per-node", "1", *argv, str(EXAMPLE)])
    assert ended.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert not (tmp_path / "runs").exists()


def test_tuning_gpus_on_a_machine_without_one_is_refused_before_any_worker_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    with pytest.raises(SystemExit) as ended:
        main(["launch", "--standalone", "--nproc-per-node", "1", "--tune", "power-limit", str(EXAMPLE)])
    assert ended.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "needs an NVIDIA GPU" in line and "dtpo simulate" in line


@pytest.mark.slow
def test_ctrl_c_keeps_what_the_agent_measured(tmp_path: Path) -> None:
    proc = subprocess.Popen(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                     str(tmp_path / "run"), str(EXAMPLE), "--epochs", "100000"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while len(list((tmp_path / "run" / "ranks").glob("*.json"))) < 2:  # both ranks have measured steps
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground process group
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("dtpo: interrupted by SIGINT; record in"), err
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "interrupted" and [r.rank for r in record.ranks] == [0, 1]
    assert all(len(rank.steps) >= 3 for rank in record.ranks)
