"""A dtpo script started plainly with `python script.py` runs as one process and writes a record."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dtpo.core.record import RunRecord

SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F
    import dtpo
    torch.manual_seed(0)
    teacher = torch.randn(8, 3)
    with dtpo.Session(precision="bf16-mixed", grad_accum=2, max_grad_norm=1.0) as session:
        model = session.wrap(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        data = ((x, (x @ teacher).argmax(1)) for x in (torch.randn(16, 8) for _ in range(10**6)))
        for x, y in session.batches(data, steps=30):
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


@pytest.mark.slow
def test_plain_python_runs_one_rank(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    result = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "throughput" in result.stdout  # the summary is printed by the process itself
    [run_dir] = list((tmp_path / "runs").iterdir())
    record = RunRecord.load(run_dir)
    assert record.status == "completed" and len(record.ranks) == 1
    assert record.environment["launcher"] == "python" and record.environment["backend"] is None
    steps = record.ranks[0].steps
    assert len(steps) == 30 and all(s.samples == 32 for s in steps)  # 2 micro-batches of 16
    assert all(s.sync_wait_s == 0.0 and s.comm_exposed_s == 0.0 for s in steps)
    assert record.totals["loss_last"]["value"] < record.totals["loss_first"]["value"]
    # Without a dtpo launcher, the process writes its own trace.
    trace = json.loads((run_dir / "trace" / "merged.json").read_text())
    assert sum(e["name"].startswith("step ") for e in trace["traceEvents"]) == 30
