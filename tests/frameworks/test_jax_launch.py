"""``dtpo launch --framework jax`` on 2 local processes: the example, the built-in workload and a script counting
its own steps and samples each get a complete record that agrees with them; a script that never reports a step
gets one line instead of an empty record; a coordinator port in use is refused before any worker starts."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core.record import RunRecord
from frameworks.support import needs

pytestmark = [needs("jax"), pytest.mark.framework, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "jax_data_parallel.py"
SIZES = (6, 10, 4)  # the counting script's per-process batch sizes, in turn

COUNTING = textwrap.dedent(f"""
    import json, os, sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    jax.distributed.initialize()
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    step = jax.jit(lambda w, x: (w + x.sum(), (x * w).mean()))
    w, steps, samples = jax.numpy.zeros(()), 0, 0
    tracker = None
    if sys.argv[2] == "track":
        from dtpo.jax import Tracker
        tracker = Tracker(total_steps=int(sys.argv[3]))
    for i in range(int(sys.argv[3])):
        local = np.ones(({SIZES}[i % 3], 4), np.float32)
        x = jax.make_array_from_process_local_data(rows, local)
        w, loss = step(w, x)
        steps, samples = steps + 1, samples + len(local)
        if tracker is not None:
            tracker.step(loss, batch=x)
    if tracker is not None:
        tracker.finish()
    with open(f"{{sys.argv[1]}}.{{jax.process_index()}}", "w") as out:
        json.dump({{"steps": steps, "samples": samples, "processes": jax.process_count()}}, out)
""")


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dtpo launch --framework jax --standalone --nproc-per-node 2 ARGS`` with its run in ``tmp_path/run``."""
    return subprocess.run(dtpo_cli("launch", "--framework", "jax", "--standalone", "--nproc-per-node", "2",
                                   "--run-dir", str(tmp_path / "run"), *args),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)


def completed(result: subprocess.CompletedProcess[str], tmp_path: Path, steps: int,
              samples: list[int]) -> RunRecord:
    """The launch succeeded; its record is complete, with both ranks' steps and samples as given."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed"
    assert [rank.rank for rank in record.ranks] == [0, 1]
    for rank, expected in zip(record.ranks, samples, strict=True):
        assert len(rank.steps) == steps, f"rank {rank.rank}"
        assert sum(step.samples for step in rank.steps) == expected, f"rank {rank.rank}"
        assert rank.device == "cpu (jax)"
    assert record.config["user"]["framework"] == "jax"
    energy = record.energy["energy_j"]
    assert energy.value and energy.value > 0 and energy.source == "estimated" and energy.note
    assert all(device["source"] in ("modelled", "measured") for rank in record.ranks
               for device in rank.energy["devices"])
    return record


def test_a_script_counting_its_own_steps_agrees_with_the_record(tmp_path: Path) -> None:
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    counts = tmp_path / "counts"
    result = launch(tmp_path, str(script), str(counts), "track", "8")
    own = [json.loads(Path(f"{counts}.{rank}").read_text()) for rank in range(2)]
    done = [SIZES[i % 3] for i in range(8)]
    assert own == [{"steps": 8, "samples": sum(done), "processes": 2}] * 2  # the script did what the test meant
    record = completed(result, tmp_path, 8, [sum(done)] * 2)
    assert [step.samples for step in record.ranks[1].steps] == done  # this process's rows of each global batch


def test_the_example_is_measured(tmp_path: Path) -> None:
    completed(launch(tmp_path, str(EXAMPLE), "--steps", "12", "--batch-size", "8"), tmp_path, 12, [96, 96])


def test_the_builtin_workload_is_measured_with_xla_flops(tmp_path: Path) -> None:
    result = launch(tmp_path, "-m", "dtpo.workloads.jax_mlp", "--steps", "12", "--batch-size", "16")
    record = completed(result, tmp_path, 12, [192, 192])
    assert all(rank.flops_per_step and rank.flops_per_step > 0 for rank in record.ranks)  # XLA's, for MFU
    assert "loss" in result.stderr


def test_a_script_that_never_reports_a_step_gets_one_line_and_no_record(tmp_path: Path) -> None:
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    result = launch(tmp_path, str(script), str(tmp_path / "counts"), "untracked", "3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if "reported no training step" in line]
    assert len(said) == 1 and "dtpo.jax.Tracker" in said[0], said
    assert not (tmp_path / "run" / "record.json").exists()
    assert json.loads((tmp_path / "counts.1").read_text())["processes"] == 2  # JAX itself did join both


def test_a_coordinator_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        result = launch(tmp_path, "--coordinator-port", str(port), str(EXAMPLE))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(port) in lines[0] and "in use" in lines[0], lines
    assert not (tmp_path / "run").exists()
