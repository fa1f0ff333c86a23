"""Job knobs on real 2-rank gloo groups: accumulation re-cut at a fixed global batch, probes, the guard, and
a tuned run's record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from torch import nn

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.config import EnergyConfig, LaunchConfig, RunConfig, SessionConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.session.loop.probe import ProbeRequest, ProbeResult
from dtpo.session.loop.rebatch import cut_batch, join_batches
from dtpo.session.tuning.job_knobs import JobTuneCallback
from dtpo.tune.guard import GuardOptions, cosine_similarity, judge_probe
from dtpo.tune.tuner import TunerOptions


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def loader(rank: int, micro: int, steps_of_samples: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches of ``micro`` samples, the same samples whatever ``micro`` is."""
    gen = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(steps_of_samples, 16, generator=gen)
    y = torch.randint(0, 4, (steps_of_samples,), generator=gen)
    return [(x[i:i + micro], y[i:i + micro]) for i in range(0, steps_of_samples, micro)]


def _train_with_switch(rank: int, world_size: int, configured: int, switch_to: int | None, out: str) -> None:
    """Three optimizer steps of 8 samples per rank; from the second on, ``switch_to`` micro-batches per step."""
    session = dtpo.Session(grad_accum=configured, warmup_steps=0, count_flops=False, progress=False,
                           energy=False, run_dir=Path(out) / f"run{configured}-{switch_to}")
    model = session.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sizes = []
    for x, y in session.batches(loader(rank, 8 // configured, 24), steps=3):
        sizes.append(int(x.shape[0]))
        session.backward(F.cross_entropy(model(x), y))
        if session.step(opt) and session.step_count == 1 and switch_to is not None:
            session.set_grad_accum(switch_to, keep_global_batch=True)
    torch.save({"params": [p.detach().clone() for p in model.parameters()], "sizes": sizes},
               Path(out) / f"result{configured}-{switch_to}-rank{rank}.pt")
    session.finish()


@pytest.mark.slow
@pytest.mark.parametrize("configured,switch_to", [(1, 4), (2, 1), (4, 2)])
def test_accumulation_switched_mid_run_at_a_fixed_global_batch_gives_the_same_updates(
        tmp_path: Path, configured: int, switch_to: int) -> None:
    run_ranks(_train_with_switch, 2, configured, None, str(tmp_path))
    run_ranks(_train_with_switch, 2, configured, switch_to, str(tmp_path))
    for rank in range(2):
        plain = torch.load(tmp_path / f"result{configured}-None-rank{rank}.pt")
        switched = torch.load(tmp_path / f"result{configured}-{switch_to}-rank{rank}.pt")
        micro = 8 // configured
        assert switched["sizes"] == [micro] * configured + [8 // switch_to] * (2 * switch_to)
        for a, b in zip(plain["params"], switched["params"], strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0), (a - b).abs().max()
    assert not all(torch.allclose(a, b) for a, b in zip(plain["params"], make_model().parameters(), strict=True))


def test_batches_are_joined_and_cut_part_by_part() -> None:
    a = (torch.arange(4).reshape(2, 2), {"y": torch.tensor([0, 1])})
    b = (torch.arange(4, 8).reshape(2, 2), {"y": torch.tensor([2, 3])})
    joined = join_batches([a, b])
    assert torch.equal(joined[0], torch.arange(8).reshape(4, 2)) and torch.equal(joined[1]["y"], torch.arange(4))
    parts = cut_batch(joined, 4)
    assert [p[1]["y"].tolist() for p in parts] == [[0], [1], [2], [3]]
    with pytest.raises(ConfigError, match="cannot be cut into 3"):
        cut_batch(joined, 3)
    with pytest.raises(ConfigError, match="must be a tensor"):
        join_batches([(torch.ones(2), "text"), (torch.ones(2), "more")])


# -- probes and the guard ----------------------------------------------------------------------------------------

class _ProbeAt(Callback):
    """At the end of step ``at``, probe the exact gradient and each of ``requests``; keep the results."""

    def __init__(self, at: int, requests: list[tuple[str, str, int, bool, int]]) -> None:
        self.at, self.requests, self.results = at, requests, {}

    def on_train_start(self, session: Any) -> None:
        session.keep_probe_batch()

    def on_step_end(self, session: Any, step_record: Any) -> None:
        if step_record.step != self.at:
            return
        for precision, compression, rank, feedback, passes in [("32-true", "none", 1, True, 1), *self.requests]:
            key = f"{precision}/{compression}-{rank}{'' if feedback else '-no-ef'}"

            def done(result: ProbeResult, key: str = key) -> None:
                self.results[key] = result

            session.request_probe(ProbeRequest(precision, compression, rank, passes, done, error_feedback=feedback))


def _probe_run(rank: int, world_size: int, out: str, probe: bool) -> None:
    requests = [("32-true", "none", 1, True, 1), ("bf16-mixed", "none", 1, True, 1),
                ("32-true", "fp16", 1, True, 1), ("32-true", "powersgd", 1, True, 4),
                ("32-true", "powersgd", 1, False, 4)]
    callback = _ProbeAt(2, requests if probe else [])
    session = dtpo.Session(warmup_steps=0, count_flops=False, progress=False, energy=False,
                           callbacks=[callback], run_dir=Path(out) / f"probe{probe}")
    torch.manual_seed(0)
    # wide square layers: a rank-1 approximation of their gradients drops most of each
    model = session.wrap(nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                                       nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(16, 64, generator=gen), torch.randint(0, 8, (16,), generator=gen)) for _ in range(5)]
    steps = 0
    for x, y in session.batches(data, steps=5):
        session.backward(F.cross_entropy(model(x), y))
        steps += session.step(opt)
    exact = callback.results.get("32-true/none-1")
    guard = GuardOptions()
    verdicts = {}
    for key, result in callback.results.items():
        cos = cosine_similarity(result.gradient, exact.gradient) if exact is not None else float("nan")
        verdicts[key] = {"cosine": cos, "accepted": judge_probe(cos, result.finite, 1.0, guard).accepted,
                         "loss": result.loss}
    if rank == 0:
        (Path(out) / f"probe{probe}.json").write_text(json.dumps({
            "steps": steps, "verdicts": verdicts, "switches": session.switch_log,
            "params": [p.detach().flatten().tolist() for p in model.parameters()],
            "compression_after": session.comm.compression if session.comm else None}))
    session.finish()


@pytest.mark.slow
def test_probes_judge_settings_without_touching_training(tmp_path: Path) -> None:
    run_ranks(_probe_run, 2, str(tmp_path), True)
    run_ranks(_probe_run, 2, str(tmp_path), False)
    probed = json.loads((tmp_path / "probeTrue.json").read_text())
    plain = json.loads((tmp_path / "probeFalse.json").read_text())
    # probes are not steps, update nothing and leave the settings as they were
    assert probed["steps"] == plain["steps"] == 5
    assert probed["compression_after"] == "none" and probed["switches"] == []
    for a, b in zip(probed["params"], plain["params"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-7, rtol=0)
    v = probed["verdicts"]
    # fp32 against itself is exact; lossless-enough settings pass; PowerSGD without error feedback fails
    assert v["32-true/none-1"]["cosine"] == pytest.approx(1.0, abs=1e-6) and v["32-true/none-1"]["accepted"]
    assert v["bf16-mixed/none-1"]["accepted"] and v["32-true/fp16-1"]["accepted"]
    assert v["32-true/powersgd-1-no-ef"]["cosine"] < GuardOptions().min_cosine
    assert not v["32-true/powersgd-1-no-ef"]["accepted"]
    # error feedback is what makes low-rank compression track the exact gradient over a few steps
    assert v["32-true/powersgd-1"]["cosine"] > v["32-true/powersgd-1-no-ef"]["cosine"] + 0.1


# -- a tuned run ----------------------------------------------------------------------------------------------------

def _tuned_run(rank: int, world_size: int, out: str) -> None:
    config = RunConfig(session=SessionConfig(warmup_steps=1, count_flops=False, window_steps=5),
                       energy=EnergyConfig(enabled=True), launch=LaunchConfig(run_dir=out))
    # steps of a few milliseconds: blocks of one step each (the default asks for 0.2 s per block)
    tuner = JobTuneCallback(TuneConfig(knob="grad-accum,compression", cost="time"),
                            options=TunerOptions(ordered=False, quick_look_steps=1))
    session = dtpo.Session.from_config(config, callbacks=[tuner], progress=False, summary=False)
    model = session.wrap(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = loader(rank, 8, 8 * 400)
    for x, y in session.batches(data, steps=120):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    (Path(out) / f"switches{rank}.json").write_text(json.dumps(session.switch_log))
    session.finish()


@pytest.mark.slow
def test_a_tuned_run_records_candidates_verdicts_and_its_trajectory_the_same_on_every_rank(
        tmp_path: Path) -> None:
    run_ranks(_tuned_run, 2, str(tmp_path))
    record = json.loads((tmp_path / "record.json").read_text())
    tunings = [r["tuning"] for r in record["ranks"]]
    assert tunings[0]["kind"] == "job" and tunings[0]["knob"] == "grad-accum,compression"
    # both ranks decided the same, and switched at the same steps
    assert tunings[0]["history"] == tunings[1]["history"]
    switches = [json.loads((tmp_path / f"switches{rank}.json").read_text()) for rank in range(2)]
    assert switches[0] == switches[1]
    report = tunings[0]
    assert report["trajectory"] and all(t["samples"] > 0 for t in report["trajectory"])
    labels = {row["grad_accum"] for row in report["settings"]}
    assert len(labels) > 1  # more than the starting accumulation was measured
    for row in report["settings"]:
        assert row["samples_per_s"] > 0 and row["comm_share"] is not None
        if row["compression"] != "none":  # whatever changed numerics went through the guard first
            assert row["guard"] is not None and "cosine" in row["guard"]["reason"]


def _batch_norm_run(rank: int, world_size: int, out: str, allow: bool) -> None:
    tuner = JobTuneCallback(TuneConfig(knob="grad-accum", allow_batch_change=allow, cost="time"),
                            options=TunerOptions(ordered=False, quick_look_steps=1))
    session = dtpo.Session(warmup_steps=1, count_flops=False, progress=False, energy=False, callbacks=[tuner],
                           summary=False, run_dir=Path(out) / f"bn{allow}")
    torch.manual_seed(0)
    model = session.wrap(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(loader(rank, 8, 8 * 60), steps=60):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.finish()
    (Path(out) / f"bn{allow}.json").write_text(json.dumps({"tuning": session.rank_record.tuning.to_dict(),
                                                           "switches": session.switch_log}, default=str))


@pytest.mark.slow
@pytest.mark.parametrize("allow", [False, True])
def test_accumulation_is_not_searched_on_a_batch_norm_model_unless_the_batch_may_change(tmp_path: Path,
                                                                                        allow: bool) -> None:
    run_ranks(_batch_norm_run, 1, str(tmp_path), allow)
    data = json.loads((tmp_path / f"bn{allow}.json").read_text())
    screened = data["tuning"]["screened"]
    if allow:
        assert "grad-accum" not in screened
        assert len({row["grad_accum"] for row in data["tuning"]["settings"]}) > 1
    else:
        assert "BatchNorm1d" in screened["grad-accum"] and "not exact" in screened["grad-accum"]
        assert all(s["setting"] != "grad_accum" for s in data["switches"])
