"""``dtpo launch`` on unmodified scripts of the libraries people train with: Hugging Face Accelerate, the
``transformers`` Trainer and PyTorch Lightning (DDP on 2 CPU ranks each, the real library, no dtpo import in the
scripts). Each script counts its own optimizer steps and the samples it trained on; the agent's record must
agree, rank by rank. ``make integration`` installs the libraries (the ``ecosystems`` extra).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core.record import RunRecord

pytestmark = [pytest.mark.ecosystem, pytest.mark.slow]

SCRIPTS = Path(__file__).resolve().parent / "scripts"
MISSING = "{} not installed: make integration installs the ecosystems extra"


def launch(script: str, tmp_path: Path, *args: str) -> tuple[RunRecord, list[dict[str, int]]]:
    """Run ``script`` under ``dtpo launch`` on 2 local ranks: the record, and each rank's own counts."""
    counts = tmp_path / "counts"
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                     str(tmp_path / "run"), str(SCRIPTS / script), "--counts", str(counts), *args),
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    own = [json.loads(Path(f"{counts}.{rank}").read_text()) for rank in range(2)]
    return record, own


def assert_agrees(record: RunRecord, own: list[dict[str, int]], steps: int, samples: int) -> None:
    """The record is complete, has both ranks, and each rank's steps and samples are the script's own."""
    assert record.status == "completed"
    assert [rank.rank for rank in record.ranks] == [0, 1]
    assert own == [{"steps": steps, "samples": samples}] * 2  # the script did what the test meant
    for rank, counted in zip(record.ranks, own, strict=True):
        assert len(rank.steps) == counted["steps"], f"rank {rank.rank}"
        assert sum(step.samples for step in rank.steps) == counted["samples"], \
            f"rank {rank.rank}: {[step.samples for step in rank.steps]}"


@pytest.mark.parametrize("args, steps, samples", [
    # 200 samples, 2 ranks, batches of 16: 7 batches per rank and epoch (the last padded by Accelerate)
    ([], 14, 224),
    (["--accumulate", "2"], 8, 224),  # the last batch of each epoch steps alone
    (["--max-steps", "4"], 4, 64),  # stopped mid-epoch: the batch Accelerate fetched ahead was never trained on
])
def test_an_accelerate_loop_is_measured_per_optimizer_step(tmp_path: Path, args: list[str], steps: int,
                                                           samples: int) -> None:
    pytest.importorskip("accelerate", reason=MISSING.format("accelerate"))
    record, own = launch("accelerate_script.py", tmp_path, *args)
    assert_agrees(record, own, steps, samples)
    if not args:  # the batches the loop trained on, one per step (not the one fetched ahead)
        assert all(step.samples == 16 for step in record.ranks[0].steps)


def test_the_transformers_trainer_is_measured_per_optimizer_step(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason=MISSING.format("transformers"))
    pytest.importorskip("accelerate", reason=MISSING.format("accelerate"))
    # 32 samples, 2 ranks, batches of 4, 2 batches per optimizer step: 2 steps per epoch; 3 stops mid-epoch
    record, own = launch("trainer_script.py", tmp_path, "--accumulate", "2", "--max-steps", "3")
    assert_agrees(record, own, 3, 24)
    assert all(step.tokens == 16 * step.samples for step in record.ranks[0].steps)  # 16 token ids per sample


def test_a_lightning_ddp_trainer_is_measured_per_optimizer_step(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_lightning", reason=MISSING.format("pytorch_lightning"))
    # 192 samples, 2 ranks, batches of 16, 2 batches per optimizer step: 3 steps per epoch; 5 stops mid-epoch
    record, own = launch("lightning_script.py", tmp_path, "--accumulate", "2", "--max-steps", "5")
    assert_agrees(record, own, 5, 160)
    assert record.config["session"]["strategy"] == "ddp"
