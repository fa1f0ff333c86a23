"""The dtpo command: bad input is one line and exit 2; train and bench produce records."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.cli.train import threads_per_worker
from dtpo.core.config import LaunchConfig, RunConfig
from dtpo.core.record import RunRecord


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["train", "--workers", "many"], "Invalid value for '--workers'"),
    (["train", "--no-such-flag"], "No such option"),
    (["launch", "does_not_exist.py"], "does not exist"),
    (["launch", "--nnodes", "1:2:3", "x.py"], "--nnodes must be"),
    (["launch", "--nproc-per-node", "-1", "x.py"], "--nproc-per-node must be"),
    (["launch", "--max-restarts", "lots", "x.py"], "invalid int value"),
    (["launch", "--nnodes", "2", "--rdzv-endpoint", "nowhere.invalid:29500", "x.py"], "cannot resolve"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "x.py").write_text("print('never run')\n")
    result = subprocess.run(dtpo_cli(*args), capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dtpo: error:") and message in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_train_two_workers_writes_a_record_and_prints_the_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "8",
                                     "--run-dir", str(run_dir)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "throughput" in result.stdout and "sync latency" in result.stdout
    record = RunRecord.load(run_dir)
    assert record.status == "completed"
    assert [r.rank for r in record.ranks] == [0, 1]
    assert all(len(r.steps) == 8 for r in record.ranks)
    assert record.config["workload"]["name"] == "mlp" and record.config["workload"]["steps"] == 8
    assert record.environment["launcher"] == "dtpo launch"
    assert record.totals["throughput"]["value"] > 0


@pytest.mark.slow
def test_bench_measures_each_worker_count(tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("bench", "--workers", "1,2", "--workload", "mlp", "--steps", "6",
                                     "--run-dir", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [row["workers"] for row in bench["rows"]] == [1, 2]
    assert bench["rows"][0]["scaling_efficiency"]["value"] == pytest.approx(1.0)
    assert bench["rows"][1]["scaling_efficiency"]["value"] > 0
    assert bench["rows"][0]["comm_overhead"]["value"] == 0.0  # one worker has nothing to communicate
    for count in (1, 2):
        assert len(RunRecord.load(tmp_path / f"workers-{count}").ranks) == count
    assert "scaling eff." in result.stdout
    assert 'id="bench-1-scaling"' in (tmp_path / "report.html").read_text()  # the bench's own report
    # Each worker count gets its own threads (1 worker does not hand its threads to the 2-worker run).
    expected = {n: threads_per_worker(RunConfig(launch=LaunchConfig(workers=n))) for n in (1, 2)}
    assert {row["workers"]: row["threads_per_worker"] for row in bench["rows"]} == expected
    for count in (1, 2):
        record = RunRecord.load(tmp_path / f"workers-{count}")
        assert {r.rank for r in record.ranks} == set(range(count))
        assert record.environment["torch_threads"] == expected[count]
    # the 2-worker run's link was probed, and the planner fits it
    samples = json.loads((tmp_path / "workers-2" / "link_probe.json").read_text())["samples"]
    assert len(samples) == 5 and all(p == 2 and t > 0 for _, p, t in samples)
    plan = subprocess.run(dtpo_cli("plan", "--from-bench", str(tmp_path), "--gpu", "cpu", "--gpu-counts", "1,2,4",
                                   "--gpus-per-node", "2", "--intra-link", "loopback", "--inter-link",
                                   "eth-25g-tcp", "--nics-per-node", "1"), capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "measured links (alpha-beta fits)" in plan.stdout
    assert "CPU ns/byte" in " ".join(plan.stdout.split())  # the probe's CPU timings were fitted and counted


SIMULATE_FLAGS = {"--gpu", "--workload", "-w", "--batch-size", "--gpus", "--steps", "--power-limit", "--sm-clock",
                  "--sweep", "--model", "--straggler", "--straggler-pattern", "--period", "--noise", "--counter-period",
                  "--seed", "--json", "--run-dir", "--store", "--list", "--tune", "--cost", "--tune-step", "--trace"}
PLAN_FLAGS = {"--from-run", "--from-bench", "--gpu", "--gpu-counts", "--gpus-per-node", "--intra-link", "--inter-link",
              "--nics-per-node", "--grad-accum", "--compare-link", "--deadline", "--budget", "--plot", "--json",
              "--run-dir", "--store"}
# Added since: the grid schedule (also in the earlier spelling, as the issue spelled it) and the power phases (a
# mode of their own only).
GRID_FLAGS = {"--grid-signal", "--grid-policy", "--deadline", "--job-hours", "--start", "--resume-s"}
PHASES_FLAGS = {"--comm-power", "--comm-share", "--power-floor", "--sample-hz"}


def _flags(command: object) -> set[str]:
    return {name for p in command.params for name in p.opts if name.startswith("-")} - {"-h", "--help"}  # type: ignore[attr-defined]


def test_the_surface_of_simulate_and_plan_is_frozen() -> None:
    """The flags generated from the simulate and plan trees are the ones written by hand before them."""
    from dtpo.cli.app import build_cli

    cli = build_cli()
    simulate, plan = cli.commands["simulate"], cli.commands["plan"]
    assert _flags(simulate) == SIMULATE_FLAGS | GRID_FLAGS  # the earlier spelling, hidden from --help
    assert all(p.hidden for p in simulate.params if p.name != "help")
    assert set(simulate.commands) == {"run", "sweep", "tune", "stragglers", "list", "phases", "grid"}
    assert _flags(plan) == PLAN_FLAGS and [p.name for p in plan.params if not p.opts[0].startswith("-")] == [
        "scenario"]
    modes = {name: _flags(command) for name, command in simulate.commands.items()}
    assert modes["list"] == {"--gpu", "--batch-size", "--trace"}
    assert "--cost" in modes["tune"] and "--cost" not in modes["stragglers"] and "--sweep" not in modes["sweep"]
    every = SIMULATE_FLAGS | GRID_FLAGS | PHASES_FLAGS
    assert set().union(*modes.values()) == every - {"--sweep", "--tune", "--list"}
