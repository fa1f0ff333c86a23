"""``dtpo bench --batch-sizes``: one worker's micro-batch timed at several sizes, and ``dtpo plan --from-bench``
splitting it into a fixed and a per-sample part."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli, run_cli

from dtpo.core.record import RunRecord


@pytest.mark.parametrize("sizes, message", [("8", "two or more different sizes"), ("8,8", "two or more different"),
                                            ("8,x", "comma-separated list of positive integers"),
                                            ("0,8", "comma-separated list of positive integers")])
def test_bad_batch_sizes_are_one_line_exit_2_and_start_nothing(sizes: str, message: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["bench", "--batch-sizes", sizes, "--workload", "mlp"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_bench_times_each_batch_size_and_the_plan_uses_the_split(tmp_path: Path) -> None:
    bench = subprocess.run(dtpo_cli("bench", "--workers", "1,2", "--batch-sizes", "8,32,128", "--workload", "mlp",
                                    "--steps", "6", "--warmup-steps", "2", "--no-report", "--no-trace", "--run-dir",
                                    str(tmp_path / "b"), "--store", str(tmp_path / "s.sqlite")),
                           capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    for size in (8, 32, 128):  # real runs, on one worker, at that micro-batch
        record = RunRecord.load(tmp_path / "b" / f"batch-{size}")
        assert len(record.ranks) == 1 and record.config["workload"]["batch_size"] == size
    section = json.loads((tmp_path / "b" / "bench.json").read_text())["micro_batch"]
    assert set(section["times_s"]) == {"8", "32", "128"} and all(t > 0 for t in section["times_s"].values())
    assert section["fit"] is None or section["fit"]["per_sample_s"] > 0
    plan = subprocess.run(dtpo_cli("plan", "--from-bench", str(tmp_path / "b"), "--gpu", "cpu", "--gpu-counts", "1,2",
                                   "--gpus-per-node", "2", "--intra-link", "loopback", "--nics-per-node", "1",
                                   "--inter-link", "eth-25g-tcp", "--json", str(tmp_path / "plan.json"), "--run-dir",
                                   str(tmp_path / "p"), "--store", str(tmp_path / "s.sqlite")),
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    notes = json.loads((tmp_path / "plan.json").read_text())["plans"][0]["assumptions"]
    split = [n for n in notes if n.startswith("micro-batch:")]
    assert len(split) == 1 and "batch sizes 8, 32, 128" in split[0]  # fitted, or said why it could not be
