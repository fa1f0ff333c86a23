"""A run that torchrun restarted keeps every attempt in its record."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core.record import RunRecord, partial_attempts

SCRIPT = textwrap.dedent("""
    import os, signal
    import torch, torch.nn.functional as F
    import dtpo
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with dtpo.Session(warmup_steps=1, energy=dtpo.EnergyConfig(sample_interval_s=None, cpu_tdp_w=20.0),
                      window_steps=2, flush_every=2, progress=False) as session:
        torch.manual_seed(0)
        model = session.wrap(torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = ((torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(10**6))
        for step, (x, y) in enumerate(session.batches(data, steps=8)):
            if attempt == 0 and step == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # a worker dies without a word
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


# One worker keeps this test about the record; several workers restart too (dtpo launch turns off torchelastic's
# shared rendezvous store, whose stale keys broke gloo's mesh after a restart): tests/cli/test_checkpoint_restarts.py.
@pytest.mark.slow
def test_a_restarted_run_keeps_the_earlier_attempt(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    run_dir = tmp_path / "run"
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                                     "--run-dir", str(run_dir), str(tmp_path / "train.py")),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "restarted the workers 1 time" in result.stderr
    record = RunRecord.load(run_dir)
    assert record.status == "completed" and record.attempt == 1
    assert all(len(r.steps) == 8 for r in record.ranks)
    [earlier] = record.restarts
    assert earlier.attempt == 0 and earlier.status == "failed"
    assert earlier.steps is not None and 1 <= earlier.steps <= 5
    assert earlier.time_s.value > 0 and earlier.energy_j.value > 0
    assert earlier.error and "rank 0" in earlier.error and "-9" in earlier.error
    assert partial_attempts(run_dir) == [0, 1]
