"""Session on real 2-rank gloo process groups: DDP equivalence, accumulation, precisions, strategies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from torch import nn

import dtpo

BATCH = 4  # per rank, per micro-step


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def global_batch(world_size: int, accum: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(world_size * accum * BATCH, 8, generator=gen)
    return x, torch.randint(0, 4, (x.shape[0],), generator=gen)


def _one_step(rank: int, world_size: int, accum: int, out: str) -> None:
    x, y = global_batch(world_size, accum)
    micro = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(rank * accum * BATCH, (rank + 1) * accum * BATCH, BATCH)]
    session = dtpo.Session(grad_accum=accum, warmup_steps=0, count_flops=False, progress=False,
                           run_dir=Path(out) / f"run{accum}")
    model = session.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for xb, yb in session.batches(micro, steps=1):
        session.backward(F.cross_entropy(model(xb), yb))
        session.step(opt)
    params = [p.detach().clone() for p in model.parameters()]
    torch.save(params, Path(out) / f"params{accum}_rank{rank}.pt")
    session.finish()


def reference_step(world_size: int, accum: int) -> list[torch.Tensor]:
    """One process, one optimizer step on the concatenated batch."""
    x, y = global_batch(world_size, accum)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 3])
def test_two_ranks_match_one_process_on_the_concatenated_batch(tmp_path: Path, accum: int) -> None:
    run_ranks(_one_step, 2, accum, str(tmp_path))
    expected = reference_step(2, accum)
    for rank in range(2):
        got = torch.load(tmp_path / f"params{accum}_rank{rank}.pt")
        for g, e in zip(got, expected, strict=True):
            assert torch.allclose(g, e, atol=1e-6, rtol=0), (rank, (g - e).abs().max())
    # and the step really moved the parameters
    assert any(not torch.allclose(e, p) for e, p in zip(expected, make_model().parameters(), strict=True))


def _learn(rank: int, world_size: int, strategy: str, out: str) -> None:
    import torch.distributed as dist

    # The group is created here, so each Session below joins it instead of owning it.
    dist.init_process_group("gloo")
    results = {}
    for precision in ("32-true", "bf16-mixed", "16-mixed"):
        session = dtpo.Session(precision=precision, strategy=strategy, grad_accum=2, warmup_steps=1,
                               count_flops=False, progress=False, run_dir=Path(out) / precision)
        torch.manual_seed(0)
        model = session.wrap(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
        gen = torch.Generator().manual_seed(100 + rank)

        def data(gen: torch.Generator = gen, teacher: torch.Tensor = teacher):
            while True:
                x = torch.randn(32, 16, generator=gen)
                yield x, (x @ teacher).argmax(1)

        losses = []
        for x, y in session.batches(data(), steps=40):
            loss = F.cross_entropy(model(x), y)
            losses.append(loss.item())
            session.backward(loss)
            session.step(opt)
        record = session.finish()
        if rank == 0:
            results[precision] = {"first": sum(losses[:6]) / 6, "last": sum(losses[-6:]) / 6,
                                  "ranks": len(record.ranks), "steps": len(record.ranks[0].steps)}
    if rank == 0:
        (Path(out) / "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_every_precision_lowers_the_loss(tmp_path: Path, strategy: str) -> None:
    run_ranks(_learn, 2, strategy, str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == {"32-true", "bf16-mixed", "16-mixed"}
    for precision, r in results.items():
        assert r["ranks"] == 2 and r["steps"] == 40, precision
        assert r["last"] < 0.7 * r["first"], (precision, r)


class _Compress(dtpo.Callback):
    """Switches gradient compression to fp16 when step 1 ends; keeps each later step's first-layer grad."""

    def on_step_end(self, session, step_record) -> None:  # type: ignore[no-untyped-def]
        if step_record.step == 1:
            session.set_compression("fp16")


def _switch_compression(rank: int, world_size: int, out: str) -> None:
    session = dtpo.Session(warmup_steps=0, count_flops=False, progress=False, energy=False,
                           run_dir=Path(out), callbacks=[_Compress()])
    model = session.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights
    x, y = global_batch(world_size, 1)
    mine = (x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH])
    grads = []
    for xb, yb in session.batches([mine] * 4, steps=4):
        session.backward(F.cross_entropy(model(xb), yb))
        grads.append(model.module[0].weight.grad.detach().clone())
        session.step(opt)
    assert session.switches["compression"].value == "fp16" and session.switches["compression"].changes_numerics
    assert torch.equal(grads[0], grads[1])  # uncompressed, the same batch gives the same mean gradient
    assert torch.equal(grads[2], grads[2].half().float())  # from step 2 on it travels as fp16
    assert not torch.equal(grads[1], grads[2])
    session.finish()


@pytest.mark.slow
def test_compression_switched_between_steps_applies_from_the_next_step(tmp_path: Path) -> None:
    run_ranks(_switch_compression, 2, str(tmp_path))
    record = dtpo.core.record.RunRecord.load(tmp_path)
    assert record.ranks[0].switches == [{"step": 2, "setting": "compression", "value": "fp16"}]


def _uneven_step(rank: int, world_size: int, shares: list[int], out: str) -> None:
    """One optimizer step of DDP where each rank trains on its share of the global batch (--tune rebalance)."""
    from dtpo.core.config import LaunchConfig, RunConfig, SessionConfig, TuneConfig

    config = RunConfig(session=SessionConfig(warmup_steps=0, count_flops=False), launch=LaunchConfig(workers=2),
                       tune=TuneConfig(knob="rebalance"))
    session = dtpo.Session(run_config=config, progress=False, run_dir=Path(out) / "uneven")
    assert session.batch_shares is not None
    session.batch_shares.set(shares)
    model = session.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for xb, yb in session.batches([global_batch(world_size, 2)], steps=1):
        assert len(xb) == shares[rank]
        session.backward(F.cross_entropy(model(xb), yb))
        session.step(opt)
    torch.save([p.detach().clone() for p in model.parameters()], Path(out) / f"uneven_rank{rank}.pt")
    session.finish()


@pytest.mark.slow
def test_an_uneven_step_updates_the_model_as_the_even_step_does(tmp_path: Path) -> None:
    """Shares of 3 and 13 samples of one global batch of 16, each rank's loss weighted by its share: the update
    is the one-process step on the whole batch (what the even split gives too), to float rounding."""
    run_ranks(_uneven_step, 2, [3, 13], str(tmp_path))
    expected = reference_step(2, 2)
    for rank in range(2):
        got = torch.load(tmp_path / f"uneven_rank{rank}.pt")
        for g, e in zip(got, expected, strict=True):
            assert torch.allclose(g, e, atol=1e-6, rtol=0), (rank, (g - e).abs().max())
