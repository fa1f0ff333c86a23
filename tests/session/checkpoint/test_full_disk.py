"""A disk that fills while checkpointing: the last complete checkpoint stays intact and loadable, the partial one is
removed, training goes on with a warning (or stops with one line under ``--on-checkpoint-error stop``), and the
record says what happened.

The full disk is simulated (a write raising ``ENOSPC``) everywhere, and real (a small tmpfs) where this process may
mount one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import dtpo_cli
from torch.distributed.checkpoint.filesystem import FileSystem

import dtpo
from dtpo.core.config import CheckpointConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord, load_partial_records
from dtpo.session.checkpoint.checkpoints import CheckpointError
from dtpo.session.checkpoint.files import TMP_SUFFIX, complete_checkpoints

NO_SPACE = "No space left on device"
FULL = "the disk is full"


def _data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    while True:
        yield torch.randn(4, 256, generator=gen), torch.randint(0, 2, (4,), generator=gen)


def _train(tmp_path: Path, name: str, ckpt_dir: Path, steps: int = 6, **ckpt: object) -> dtpo.Session:
    """One process, a 256x256 linear layer (a checkpoint of about 260 kB), a checkpoint every 2 steps."""
    torch.manual_seed(0)
    session = dtpo.Session(warmup_steps=0, energy=False, progress=False, summary=False, count_flops=False,
                           run_dir=tmp_path / name, checkpoint=CheckpointConfig(dir=str(ckpt_dir), **ckpt))
    with session:
        model = session.wrap(torch.nn.Linear(256, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        session.attach(opt)
        for x, y in session.batches(_data(), steps=steps):
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
    return session


@pytest.fixture
def disk_full_from_step_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint file of step 4 and later gets one byte written, then ``ENOSPC``, as on a full disk."""
    original = FileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(self: FileSystem, path: str | Path, mode: str) -> Iterator[object]:
        folder = Path(path).parent.name
        if folder.endswith(TMP_SUFFIX) and int(folder[len("step-"):-len(TMP_SUFFIX)]) >= 4:
            with open(path, "wb") as partial:
                partial.write(b"x")
            raise OSError(errno.ENOSPC, NO_SPACE, str(path))
        with original(self, path, mode) as stream:
            yield stream

    monkeypatch.setattr(FileSystem, "create_stream", create_stream)


@pytest.fixture
def warnings_seen(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The warnings dtpo logs during the test (its logger writes to stderr and does not propagate)."""
    logger = logging.getLogger("dtpo")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger="dtpo"):
            yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def _check_kept_step_2(ckpt_dir: Path, session: dtpo.Session, why: str = NO_SPACE) -> None:
    assert [info.step for info in complete_checkpoints(ckpt_dir)] == [2]
    assert complete_checkpoints(ckpt_dir)[0].problem() is None
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-000002"]  # no partial folder left
    entries = {e["step"]: e for e in session.rank_record.checkpoints}
    assert "error" not in entries[2]
    assert why in entries[4]["error"] and entries[4]["kept"] == "step-000002"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # one process: meant so
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_on_a_full_disk_is_removed_and_training_goes_on(tmp_path: Path, disk_full_from_step_4: None,
                                                               warnings_seen: pytest.LogCaptureFixture,
                                                               async_save: bool) -> None:
    session = _train(tmp_path, "full", tmp_path / "ckpt", every="2", keep=2, async_save=async_save)
    assert session.record.status == "completed" and session.step_count == 6
    _check_kept_step_2(tmp_path / "ckpt", session)
    assert NO_SPACE in session.rank_record.checkpoints[-1]["error"]  # step 6 too: the disk stayed full
    warnings = [m for m in warnings_seen.messages if "checkpoint of step 4 failed" in m]
    assert len(warnings) == 1 and "step-000002 stays the newest complete checkpoint" in warnings[0]
    assert "training goes on" in warnings[0] and "\n" not in warnings[0]
    saved = RunRecord.load(tmp_path / "full")  # the record on disk says it too
    assert NO_SPACE in saved.ranks[0].checkpoints[1]["error"]


def test_the_checkpoint_kept_after_a_full_disk_loads(tmp_path: Path, disk_full_from_step_4: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _train(tmp_path, "full", tmp_path / "ckpt", every="2")
    monkeypatch.undo()  # space again
    session = _train(tmp_path, "resumed", tmp_path / "ckpt", resume="latest")
    assert session.record.resumed is not None and session.record.resumed["step"] == 2
    assert [s.step for s in session.rank_record.steps] == [2, 3, 4, 5]


def test_stop_ends_the_run_with_one_line_at_the_failed_save(tmp_path: Path, disk_full_from_step_4: None) -> None:
    with pytest.raises(CheckpointError) as caught:
        _train(tmp_path, "stop", tmp_path / "ckpt", every="2", on_error="stop")
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 1
    assert message.startswith("checkpoint of step 4 failed") and NO_SPACE in message
    assert "step-000002 stays the newest complete checkpoint" in message and "training stops" in message
    [partial] = load_partial_records(tmp_path / "stop")  # a failed run leaves its ranks' records
    rank = partial.ranks[0]
    assert partial.status == "failed" and rank.error == f"CheckpointError: {message}"
    assert [s.step for s in rank.steps] == [0, 1, 2, 3] and NO_SPACE in rank.checkpoints[-1]["error"]
    assert [info.step for info in complete_checkpoints(tmp_path / "ckpt")] == [2]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002"]


def test_a_bad_on_checkpoint_error_value_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^checkpoint.on_error must be one of warn, stop, got 'ignore' "
                                          r"\(--on-checkpoint-error\)$"):
        CheckpointConfig(on_error="ignore")


# -- a real full disk: a small tmpfs ------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``path`` (the test is skipped where mounting is not allowed)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}): the full-disk "
                    "case runs simulated only")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def _room_for_one_and_a_half(checkpoint_bytes: int) -> int:
    """A tmpfs size that holds one checkpoint of ``checkpoint_bytes`` but not two (a save writes its folder before
    the previous one is pruned), in whole pages."""
    return (checkpoint_bytes * 3 // 2 // 4096 + 1) * 4096


def test_a_real_full_disk_keeps_the_last_complete_checkpoint(tmp_path: Path,
                                                             warnings_seen: pytest.LogCaptureFixture) -> None:
    weights = 256 * 256 * 4  # the layer's weights; SGD keeps no state
    with _tmpfs(tmp_path / "small", _room_for_one_and_a_half(weights)) as disk:
        session = _train(tmp_path, "full", disk, every="2", keep=1)
        assert session.record.status == "completed" and session.step_count == 6
        # torch's writer says "unexpected pos ..." where the disk filled; the free space tells what happened
        _check_kept_step_2(disk, session, why=FULL)
        assert any("checkpoint of step 4 failed" in m and FULL in m for m in warnings_seen.messages)
        resumed = _train(tmp_path, "resumed", disk, resume="latest")
        assert resumed.record.resumed is not None and resumed.record.resumed["step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("on_error", ["warn", "stop"])
def test_dtpo_train_on_a_full_disk(tmp_path: Path, on_error: str) -> None:
    """Two workers of the mlp (AdamW: a checkpoint holds the weights and two moments) into a tmpfs with room for one
    checkpoint and a half."""
    from dtpo.workloads import get_workload

    weights = sum(p.numel() * p.element_size() for p in get_workload("mlp").build_model().parameters())
    run_dir = tmp_path / "run"
    with _tmpfs(tmp_path / "small", _room_for_one_and_a_half(3 * weights)) as disk:
        result = subprocess.run(dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "6",
                                         "--batch-size", "8", "--threads-per-worker", "1", "--no-report",
                                         "--no-trace", "--checkpoint-every", "2", "--checkpoint-keep", "1",
                                         "--checkpoint-dir", str(disk), "--on-checkpoint-error", on_error,
                                         "--run-dir", str(run_dir)),
                                capture_output=True, text=True, timeout=300)
        assert sorted(p.name for p in disk.iterdir()) == ["step-000002"]
        assert complete_checkpoints(disk)[0].problem() is None
    record = json.loads((run_dir / "record.json").read_text())
    lines = [line for line in result.stderr.splitlines() if "checkpoint of step 4 failed" in line]
    assert lines and FULL in lines[0] and "step-000002 stays the newest complete checkpoint" in lines[0]
    if on_error == "warn":
        assert result.returncode == 0, result.stderr
        assert record["status"] == "completed"
        assert "training goes on" in lines[0]
        for rank in record["ranks"]:
            failed = [e for e in rank["checkpoints"] if "error" in e]
            assert [e["step"] for e in failed] == [4, 6] and all(FULL in e["error"] for e in failed)
    else:
        assert result.returncode == 1, result.stderr
        assert record["status"] == "failed" and FULL in record["error"]
        assert "training stops (--on-checkpoint-error stop)" in record["error"]
        last = result.stderr.splitlines()[-1]  # the launcher saw an exit code: the record's words follow it
        assert "run failed: rank 0 exited with code 1" in last and "checkpoint of step 4 failed" in last
