"""The evaluation set and the loss of a model on it, alone and shared out over two gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import run_ranks

import dtpo.workloads.base
from dtpo.workloads import get_workload
from dtpo.workloads.base import EVALUATION_SAMPLES
from dtpo.workloads.evaluation import evaluate


def test_the_evaluation_set_is_the_same_every_time_and_not_a_training_stream() -> None:
    workload = get_workload("cnn")
    first, again = workload.evaluation_batches(), get_workload("cnn").evaluation_batches()
    assert sum(workload.samples_in(b) for b in first) >= EVALUATION_SAMPLES
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again, strict=True))
    training = next(workload.batches(workload.default_batch_size, 0, 1, seed=0))
    assert not torch.equal(training[0], first[0][0])


def _model(workload_name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return get_workload(workload_name).build_model()


def test_the_loss_is_the_sample_weighted_mean_over_the_set_and_the_mode_is_restored() -> None:
    workload = get_workload("mlp")
    model = _model("mlp")
    with torch.no_grad():
        expected = sum(float(workload.loss(model(x), y)) * len(y) for x, y in workload.evaluation_batches())
    samples = sum(len(y) for _, y in workload.evaluation_batches())
    result = evaluate(model, workload, torch.device("cpu"))
    assert result.samples == samples
    assert abs(result.loss - expected / samples) < 1e-6
    assert model.training  # back in training mode after an eval-mode pass


def _two_ranks(rank: int, world_size: int, out: str, samples: int) -> None:
    dtpo.workloads.base.EVALUATION_SAMPLES = samples
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    result = evaluate(_model("mlp"), get_workload("mlp"), torch.device("cpu"), rank, world_size)
    dist.barrier()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result.as_dict()))


@pytest.mark.slow
@pytest.mark.parametrize("samples", [1024, 384])  # 8 batches of 128, or 3: rank 1 repeats one it leaves out
def test_two_ranks_share_the_set_out_and_both_return_the_whole_set_mean(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, samples: int) -> None:
    monkeypatch.setattr(dtpo.workloads.base, "EVALUATION_SAMPLES", samples)
    alone = evaluate(_model("mlp"), get_workload("mlp"), torch.device("cpu"))
    run_ranks(_two_ranks, 2, str(tmp_path), samples)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    assert results[0]["samples"] == alone.samples == samples
    assert abs(results[0]["loss"] - alone.loss) < 1e-6
