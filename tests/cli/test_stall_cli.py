"""A worker that stops (``SIGSTOP``) while the other waits for it in a gloo collective: the launcher names it
within the stall limit instead of waiting for gloo's 30-minute timeout, the record says ``stalled``, and under
``--max-restarts`` the group resumes from the last checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import dtpo_cli, run_cli

from dtpo.core.record import RunRecord, rank_record_path

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch, torch.nn.functional as F
    import dtpo
    from dtpo.core.config import CheckpointConfig

    stop_at = int(sys.argv[1])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with dtpo.Session(warmup_steps=1, energy=dtpo.EnergyConfig(sample_interval_s=None, cpu_tdp_w=20.0),
                      window_steps=2, flush_every=2, progress=False,
                      checkpoint=CheckpointConfig(every="3")) as session:
        torch.manual_seed(0)
        model = session.wrap(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        session.attach(opt)
        gen = torch.Generator().manual_seed(100 + session.rank)
        data = ((x, (x.sum(1) > 0).long()) for x in (torch.randn(4, 8, generator=gen) for _ in range(10**6)))
        for x, y in session.batches(data, steps=10):
            if attempt == 0 and session.rank == 1 and session.step_count == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)  # stops here; the launcher's SIGKILL ends it
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


def _launch(tmp_path: Path, name: str, restarts: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    return subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
                                   "--stall-floor", "3", "--run-dir", str(tmp_path / name),
                                   str(tmp_path / "train.py"), "7"),
                          capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_a_stopped_rank_is_named_and_the_record_says_stalled(tmp_path: Path) -> None:
    result = _launch(tmp_path, "stalled", restarts=0)
    assert result.returncode == 1, result.stderr
    assert "dtpo: error: rank 1 on node" in result.stderr and "stalled at step 7" in result.stderr
    assert "dtpo: run stalled: rank 1 on node" in result.stderr.splitlines()[-1]
    record = RunRecord.load(tmp_path / "stalled")
    assert record.status == "stalled"
    assert record.error is not None and record.error.startswith("rank 1 on node") and "at step 7" in record.error
    by_rank = {rank.rank: rank for rank in record.ranks}
    assert (by_rank[1].error or "").startswith("stalled at step 7: no progress for")


@pytest.mark.slow
def test_under_restarts_a_stalled_group_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    result = _launch(tmp_path, "resumed", restarts=1)
    assert result.returncode == 0, result.stderr
    assert "restarted the workers 1 time (attempt 0: rank 1 on node" in result.stderr
    record = RunRecord.load(tmp_path / "resumed")
    assert record.status == "completed" and record.attempt == 1
    assert record.resumed is not None and record.resumed["step"] == 6
    [earlier] = record.restarts
    assert earlier.status == "stalled" and "rank 1 on node" in (earlier.error or "")
    assert "stalled at step 7" in (earlier.error or "")


@pytest.mark.parametrize("argv", [["train", "--stall-floor", "1"], ["train", "--stall-factor", "-2"],
                                  ["launch", "--standalone", "--stall-floor", "0.5", "x.py"],
                                  ["launch", "--standalone", "--stall-factor", "nan", "x.py"]])
def test_a_stall_setting_that_cannot_work_is_one_line_and_exit_2(argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(argv, capsys)
    assert code == 2, err
    assert "--stall-" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _worker_pid(run_dir: Path, rank: int) -> int | None:
    """The process of rank ``rank`` of the run in ``run_dir`` (from the launch contract in its environment)."""
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            values = dict(item.split("=", 1) for item in environ.read_text().split("\0") if "=" in item)
        except OSError:
            continue
        if values.get("DTPO_RUN_DIR") == str(run_dir) and values.get("RANK") == str(rank):
            return int(environ.parent.name)
    return None


@pytest.mark.slow
def test_dtpo_train_names_a_stopped_worker_and_the_waiting_one_ends_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(dtpo_cli("train", "--workers", "2", "--workload", "mlp", "--steps", "100000",
                                     "--stall-floor", "3", "--run-dir", str(run_dir)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not rank_record_path(run_dir, 1).exists() or _worker_pid(run_dir, 1) is None:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        os.kill(_worker_pid(run_dir, 1), signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "stalled at step" in err and "Traceback" not in err, err
    assert "a collective failed because another rank stopped" in err or "[rank0]" not in err
    assert RunRecord.load(run_dir).status == "stalled"
