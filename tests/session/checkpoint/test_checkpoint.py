"""Checkpoints through torch.distributed.checkpoint: a resumed run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from conftest import run_ranks
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import dtpo
from dtpo.core.config import CheckpointConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.session.checkpoint.files import (
    MARKER,
    check_compatible,
    complete_checkpoints,
    newest_complete,
    prune,
    read_marker,
    resume_candidates,
)
from dtpo.session.checkpoint.state import model_fingerprint

STEPS = 8


class Net(torch.nn.Module):
    """Two blocks in a ModuleList (FSDP2 shards each) and dropout (the RNG state must come back)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 16), torch.nn.Linear(16, 16)])
        self.drop = torch.nn.Dropout(0.2)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.drop(torch.relu(block(x)))
        return self.head(x)


def _data(rank: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(100 + rank)
    while True:
        x = torch.randn(4, 8, generator=gen)
        yield x, (x.sum(1) > 0).long() + (x[:, 0] > 1).long()


def _train(rank: int, world_size: int, out: str, name: str, strategy: str, ckpt: dict, stop: int | None) -> None:
    """Train ``STEPS`` steps (or stop as if killed after step ``stop``); rank 0 saves the final weights."""
    torch.manual_seed(0)
    session = dtpo.Session(strategy=strategy, warmup_steps=1, energy=False, progress=False, summary=False,
                           count_flops=False, run_dir=Path(out) / name, checkpoint=CheckpointConfig(**ckpt))
    model = session.wrap(Net())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    session.attach(opt)
    for x, y in session.batches(_data(rank), steps=STEPS):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
        if session.step_count == stop:
            session.finish(error=RuntimeError("stopped as if killed"))
            # tear down as dtpo's leave() does after a normal end (both ranks stop at this step): a rank whose
            # group went first while the other was still in its async checkpoint's gather made that one abort
            dist.barrier()
            dist.destroy_process_group()
            return
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    session.finish()
    if rank == 0:
        torch.save(weights, Path(out) / f"{name}.pt")


def _same_weights(out: Path, a: str, b: str) -> bool:
    first, second = torch.load(out / f"{a}.pt"), torch.load(out / f"{b}.pt")
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, background", [("ddp", False), ("fsdp", True)])
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path: Path, strategy: str,
                                                                  background: bool) -> None:
    ckpt = {"every": "3", "dir": str(tmp_path / "ckpt"), "keep": 2, "async_save": background}
    run_ranks(_train, 2, str(tmp_path), "full", strategy, {}, None)
    run_ranks(_train, 2, str(tmp_path), "killed", strategy, ckpt, 7)  # checkpoints after steps 3 and 6
    assert [info.step for info in complete_checkpoints(tmp_path / "ckpt")] == [6, 3]
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-truncated")
    run_ranks(_train, 2, str(tmp_path), "resumed", strategy, {**ckpt, "resume": "latest"}, None)
    assert _same_weights(tmp_path, "full", "resumed")
    record = RunRecord.load(tmp_path / "resumed")
    assert record.resumed is not None and record.resumed["step"] == 6
    assert all([s.step for s in r.steps] == [6, 7] for r in record.ranks)
    assert record.totals["measured_steps"].value == 1  # step 6 is the resumed attempt's warm-up
    if strategy == "fsdp":
        return
    # A truncated file in the newest checkpoint: the previous complete one is used, and the end is the same.
    newest = tmp_path / "ckpt-truncated" / "step-000006"
    victim = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    assert newest_complete(tmp_path / "ckpt-truncated").step == 3
    truncated = {**ckpt, "dir": str(tmp_path / "ckpt-truncated"), "resume": "latest"}
    run_ranks(_train, 2, str(tmp_path), "fallback", strategy, truncated, None)
    assert _same_weights(tmp_path, "full", "fallback")
    assert RunRecord.load(tmp_path / "fallback").resumed["step"] == 3


def _resume_bad(rank: int, world_size: int, out: str, ckpt: dict) -> None:
    session = dtpo.Session(warmup_steps=0, energy=False, progress=False, summary=False, count_flops=False,
                           run_dir=Path(out) / "bad", checkpoint=CheckpointConfig(**ckpt))
    model = session.wrap(torch.nn.Linear(8, 3))  # another model than Net
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach(opt)
    with pytest.raises(ConfigError, match="of another model"):
        next(iter(session.batches(_data(rank), steps=2)))
    session.finish(error=ConfigError("bad"))
    dist.destroy_process_group()
    (Path(out) / f"refused{rank}").touch()


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused_on_every_rank(tmp_path: Path) -> None:
    ckpt = {"every": "2", "dir": str(tmp_path / "ckpt")}
    run_ranks(_train, 2, str(tmp_path), "short", "ddp", ckpt, 3)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*")}
    run_ranks(_resume_bad, 2, str(tmp_path), {**ckpt, "resume": "latest"})
    assert (tmp_path / "refused0").exists() and (tmp_path / "refused1").exists()
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ckpt").rglob("*")} == before  # nothing touched


# -- on disk, without processes ---------------------------------------------------------------------------------


def _fake(root: Path, step: int, world_size: int = 2, fingerprint: str = "f", marker: bool = True) -> Path:
    path = root / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if marker:
        (path / MARKER).write_text(json.dumps({"schema": "dtpo.checkpoint/1", "step": step, "world_size": world_size,
                                               "fingerprint": fingerprint, "files": {"__0_0.distcp": 10}}))
    return path


def test_only_complete_checkpoints_count_and_pruning_keeps_the_newest(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _fake(tmp_path, step)
    _fake(tmp_path, 8, marker=False)  # the marker is written last: a save that never completed
    (tmp_path / "step-000010.tmp").mkdir()  # a save under way when the run was killed
    assert [info.step for info in complete_checkpoints(tmp_path)] == [6, 4, 2]
    removed = prune(tmp_path, keep=2)
    assert {p.name for p in removed} == {"step-000002", "step-000010.tmp"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004", "step-000006", "step-000008"]


def test_a_truncated_file_makes_a_checkpoint_incomplete(tmp_path: Path) -> None:
    _fake(tmp_path, 2)
    newest = _fake(tmp_path, 4)
    (newest / "__0_0.distcp").write_bytes(b"x" * 3)
    assert read_marker(newest) is not None and "truncated" in read_marker(newest).problem()  # type: ignore[union-attr]
    assert newest_complete(tmp_path).step == 2  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        resume_candidates(str(newest), tmp_path)


def test_bad_resume_requests_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no complete checkpoint in"):
        resume_candidates("latest", tmp_path)
    with pytest.raises(ConfigError, match="no such checkpoint"):
        resume_candidates(str(tmp_path / "nowhere"), tmp_path)
    info = read_marker(_fake(tmp_path, 2, world_size=4, fingerprint=model_fingerprint(torch.nn.Linear(2, 2))))
    assert info is not None
    with pytest.raises(ConfigError, match="written by 4 processes, this run has 2"):
        check_compatible(info, 2, model_fingerprint(torch.nn.Linear(2, 2)))
    with pytest.raises(ConfigError, match="of another model"):
        check_compatible(info, 4, model_fingerprint(torch.nn.Linear(2, 3)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_checkpoint_dir_stops_the_session_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="is not writable"):
            dtpo.Session(energy=False, progress=False, run_dir=tmp_path / "run",
                         checkpoint=CheckpointConfig(every="5", dir=str(folder)))
    finally:
        folder.chmod(0o700)


def test_a_checkpoint_dir_that_is_a_file_stops_the_session_at_once(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        dtpo.Session(energy=False, progress=False, run_dir=tmp_path / "run",
                     checkpoint=CheckpointConfig(every="5", dir=str(tmp_path / "file")))


# -- one process, in this one ------------------------------------------------------------------------------------


class Numbers:
    """An iterable that knows its own position, as torchdata's StatefulDataLoader does."""

    def __init__(self) -> None:
        self.position = 0
        self.loaded: dict | None = None

    def __iter__(self):  # type: ignore[no-untyped-def]
        while True:
            self.position += 1
            x = torch.full((2, 4), float(self.position))
            yield x, torch.zeros(2, dtype=torch.long)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state
        self.position = state["position"]


def _one_process(tmp_path: Path, name: str, data: object, stop: int | None, steps: int = 6,
                 **ckpt: object) -> dtpo.Session:
    torch.manual_seed(0)
    session = dtpo.Session(warmup_steps=0, energy=False, progress=False, summary=False, count_flops=False,
                           run_dir=tmp_path / name, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), **ckpt))
    model = session.wrap(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach(opt)
    for x, y in session.batches(data, steps=steps):  # type: ignore[arg-type]
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
        if session.step_count == stop:
            break
    session.finish()
    return session


def test_an_iterable_with_its_own_state_is_restored_through_it(tmp_path: Path) -> None:
    _one_process(tmp_path, "first", Numbers(), stop=5, every="2")
    data = Numbers()
    session = _one_process(tmp_path, "second", data, stop=None, every="2", resume="latest")
    assert session.record.resumed is not None and session.record.resumed["step"] == 4
    assert data.loaded == {"position": 4}  # where it stood after the 4th step, not replayed
    assert [s.step for s in session.rank_record.steps] == [4, 5]


def test_a_duration_is_turned_into_steps_and_saving_by_hand_works(tmp_path: Path) -> None:
    def slow():  # type: ignore[no-untyped-def]
        import time

        for x, _y in _data(0):
            time.sleep(0.05)
            yield x[:, :4], torch.zeros(4, dtype=torch.long)

    session = _one_process(tmp_path, "timed", slow(), stop=None, steps=12, every="0.2s", keep=10)
    saved = [c["step"] for c in session.rank_record.checkpoints]
    assert len(saved) >= 3 and saved == sorted(set(saved))  # at most 4 steps per 0.2 s
    session.save_checkpoint()  # after the end, by hand: the step count is 12
    assert newest_complete(tmp_path / "ckpt").step == 12  # type: ignore[union-attr]
    assert [info.step for info in complete_checkpoints(tmp_path / "ckpt")][1:] == [s for s in saved[::-1] if s < 12]


def test_a_checkpoint_dcp_cannot_read_is_skipped_for_the_previous_one(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    _one_process(tmp_path, "first", Numbers(), stop=5, every="2")
    newest = tmp_path / "ckpt" / "step-000004"
    for part in newest.glob("*.distcp"):  # same sizes, so the marker cannot tell: only loading does
        part.write_bytes(bytes(part.stat().st_size))
    data = Numbers()
    with caplog.at_level("WARNING"):
        session = _one_process(tmp_path, "second", data, stop=None, every="2", resume="latest")
    assert "cannot load checkpoint" in caplog.text and "step-000004" in caplog.text
    assert session.record.resumed is not None and session.record.resumed["step"] == 2
    assert data.loaded == {"position": 2}
