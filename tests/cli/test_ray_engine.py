"""``dtpo train --engine ray``: Ray Train starts the workers, the run ends with the same record, summary, report
and traces as under torchrun; bad Ray settings stop before anything is written; a worker killed after a
checkpoint under ``--max-restarts`` is restarted by Ray and the run ends bit-identical to one never stopped."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import dtpo_cli, run_cli

from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.distributed.ray_engine import parse_ray_address
from dtpo.distributed.ray_failures import describe_worker_failures
from dtpo.session.checkpoint.files import MARKER

RAY_MISSING = ("Ray Train is part of what `make test` installs (pip install -c constraints.txt -e '.[dev,ray]'); "
               "it is not importable here")


def test_ray_train_is_installed() -> None:
    """Not skipped when missing: the Ray engine's tests must run in `make test`."""
    assert importlib.util.find_spec("ray") is not None, RAY_MISSING
    import ray.train.torch  # noqa: F401


def test_ray_addresses_are_parsed() -> None:
    assert parse_ray_address("10.0.0.5") == ("10.0.0.5", 6379, False)
    assert parse_ray_address("head:6380") == ("head", 6380, False)
    assert parse_ray_address("ray://head") == ("head", 10001, True)
    assert parse_ray_address("ray://[::1]:10002") == ("::1", 10002, True)
    for bad in ("head:port", "head:70000", ":6379", "http://head/x"):
        with pytest.raises(ConfigError, match="--ray-address must be"):
            parse_ray_address(bad)


def test_a_failed_attempt_is_one_line_naming_the_rank() -> None:
    text = describe_worker_failures({1: RuntimeError("Traceback ...\n  File x\nValueError: bad batch"),
                                     3: RuntimeError("peer gone")})
    assert text == "rank 1: RuntimeError: ValueError: bad batch (and 1 other rank)"


def test_an_unreachable_ray_address_stops_before_the_run_dir(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    code, _, err = run_cli(["train", "--engine", "ray", "--ray-address", "127.0.0.1:1", "--workload", "mlp",
                            "--run-dir", str(run_dir)], capsys)
    assert code == 2 and time.monotonic() - started < 60
    assert err.count("\n") == 1 and "no Ray cluster answers at 127.0.0.1:1" in err, err
    assert not run_dir.exists()


def test_a_ray_address_needs_the_ray_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["train", "--ray-address", "127.0.0.1:6379", "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "needs --engine ray" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


# -- real runs on a local Ray instance (tens of seconds each: Ray starts its own processes) ---------------------


def _train(run_dir: Path, *flags: str, engine: str = "ray") -> list[str]:
    return dtpo_cli("train", "--engine", engine, "--workload", "mlp", "--workers", "2", "--run-dir", str(run_dir),
                    *flags)


@pytest.mark.slow
def test_dtpo_train_runs_on_ray(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(_train(run_dir, "--steps", "6", "--warmup-steps", "2"), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    record = RunRecord.load(run_dir)
    assert record.status == "completed" and record.attempt == 0 and not record.restarts
    assert [r.rank for r in record.ranks] == [0, 1]
    assert all([s.step for s in r.steps] == list(range(6)) for r in record.ranks)
    assert record.environment["launcher"] == "ray" and record.environment["world_size"] == 2
    assert record.config["launch"]["engine"] == "ray"
    assert (run_dir / "report.html").is_file() and (run_dir / "trace" / "merged.json").is_file()
    assert "dtpo run run (completed)" in result.stdout
    assert "Traceback" not in result.stderr and "TrainController" not in result.stderr  # Ray's chatter: in the log
    assert not (run_dir / "ray").exists()  # dtpo's bookkeeping of the Ray run is gone


def _ray_workers(pid: int) -> list[int]:
    """The Ray Train worker processes under the ``dtpo train`` process ``pid`` (its local Ray instance's)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            pending.append(child)
            try:
                if b"RayTrainWorker" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
            except OSError:
                continue
    return found


def _final_weights(run_dir: Path, step: int, out: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(run_dir / "checkpoints" / f"step-{step:06d}", out)
    return torch.load(out, weights_only=False)["train"]["model"]


@pytest.mark.slow
def test_ray_restarts_a_killed_worker_and_the_run_ends_bit_identical(tmp_path: Path) -> None:
    """Ray Train restarts the worker group (``FailureConfig``), the workers resume from the last checkpoint, and
    the final weights equal those of the same run under torchrun, never stopped."""
    steps, flags = 200, ("--warmup-steps", "1", "--checkpoint-every", "5")
    reference = subprocess.run(_train(tmp_path / "torchrun", "--steps", str(steps), *flags, engine="torchrun"),
                               capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-3000:]

    run_dir = tmp_path / "ray"
    proc = subprocess.Popen(_train(run_dir, "--steps", str(steps), "--max-restarts", "1", *flags),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        while not list((run_dir / "checkpoints").glob(f"*/{MARKER}")):  # a complete checkpoint, then the kill
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        workers = _ray_workers(proc.pid)
        assert len(workers) == 2, workers
        os.kill(max(workers), signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Ray Train restarted the workers 1 time" in err
    record = RunRecord.load(run_dir)
    assert record.status == "completed" and record.attempt == 1 and record.environment["launcher"] == "ray"
    assert record.resumed is not None and record.resumed["step"] % 5 == 0
    [earlier] = record.restarts
    assert earlier.attempt == 0 and earlier.status == "failed" and "rank" in (earlier.error or "")
    assert earlier.resumed_from_step == record.resumed["step"]
    assert record.ranks[0].steps[-1].step == steps - 1
    expected = _final_weights(tmp_path / "torchrun", steps, tmp_path / "a.pt")
    got = _final_weights(run_dir, steps, tmp_path / "b.pt")
    assert expected and expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.slow
def test_sigterm_to_the_ray_driver_ends_the_run_as_interrupted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_train(run_dir, "--steps", "100000", "--warmup-steps", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        while not list((run_dir / "ranks").glob("*.json")):  # training has started
            assert proc.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "interrupted by SIGTERM" in err
    record = RunRecord.load(run_dir)
    assert record.status == "interrupted" and len(record.ranks) == 2
    assert (run_dir / "report.html").is_file()
