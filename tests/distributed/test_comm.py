"""GradientComm: last-gradient stamps, switchable compression, accumulation parity (2 gloo ranks)."""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import torch.distributed as dist
from conftest import run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dtpo.core.errors import ConfigError
from dtpo.distributed import compression as compression_module
from dtpo.distributed.comm_timing import COMPRESSIONS, GradientComm, changes_numerics
from dtpo.distributed.compression import check_compression
from dtpo.distributed.process_group import DistContext
from dtpo.distributed.wrap import wrap_model

WIDTH = 16


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(WIDTH, WIDTH)  # a 16x16 weight (PowerSGD compresses it) and a bias (it does not)


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1000 * step + rank))


def _exact_mean(local: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Each parameter's gradient averaged over ranks, computed without DDP (float64 sum of float32 grads)."""
    local.zero_grad(set_to_none=True)
    (local(x) ** 2).sum().backward()
    means = []
    for p in local.parameters():
        parts = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, p.grad)
        means.append((sum(t.double() for t in parts) / len(parts)).float())
    return means


def _representable(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return torch.equal(t, t.to(dtype).float())


def _switching(rank: int, out: str) -> None:
    """Stamps come during backward; each compression takes effect at the step after it is chosen."""
    counter = itertools.count()
    comm = GradientComm(lambda: next(counter))
    model = DistributedDataParallel(_model())
    comm.attach(model)
    local = _model()
    # (compression, powersgd rank) per step; "none" -> "fp16" is the first switch (registers the dispatcher)
    # and the last "none" goes through DDP's all-reduce written in Python.
    plan = [("none", 1), ("fp16", 1), ("bf16", 1), ("powersgd", 1), ("powersgd", 1), ("none", 1)]
    seen = []
    for step, (name, rank_r) in enumerate(plan):
        comm.set_compression(name, powersgd_rank=rank_r)
        x = _batch(rank, step)
        model.zero_grad(set_to_none=True)
        loss = (model(x) ** 2).sum()
        comm.reset()
        before = next(counter)
        loss.backward()
        after = next(counter)
        # weight and bias, each stamped once, while learning (the first reset() has no backward before it); then the
        # weight alone, the last gradient (the parameters nearest the input come last)
        assert comm.ready_count == comm.hooked == (2 if step < 2 else 1), (step, comm.ready_count, comm.hooked)
        assert before < comm.last_ready < after  # stamped during backward, before it returned
        assert comm.compression == name
        weight, bias = (p.grad for p in model.module.parameters())
        exact_w, exact_b = _exact_mean(local, x)
        tol = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2}
        if name in tol:
            torch.testing.assert_close(weight, exact_w, rtol=tol[name], atol=tol[name] * exact_w.abs().max())
            torch.testing.assert_close(bias, exact_b, rtol=tol[name], atol=tol[name] * exact_b.abs().max())
        if name == "none":
            assert not _representable(weight, torch.float16)
        if name in ("fp16", "bf16"):
            dtype = torch.float16 if name == "fp16" else torch.bfloat16
            assert _representable(weight, dtype) and _representable(bias, dtype)
            assert not torch.equal(weight, exact_w)
        if name == "powersgd":
            assert torch.linalg.matrix_rank(weight).item() <= rank_r  # the mean of rank-1 factors
            assert not torch.allclose(weight, exact_w, rtol=0.1, atol=0.1 * exact_w.abs().max().item())
            torch.testing.assert_close(bias, exact_b, rtol=1e-6, atol=1e-6)  # 1-D: all-reduced uncompressed
        seen.append(name)
    # A backend that cannot all-reduce bf16: one ConfigError naming both, and the setting stays.
    original = compression_module._backend_lacks
    compression_module._backend_lacks = lambda backend, dtype: "simulated" if dtype == torch.bfloat16 else None
    try:
        with pytest.raises(ConfigError, match="'bf16'.*backend 'gloo'"):
            comm.set_compression("bf16")
    finally:
        compression_module._backend_lacks = original
    assert comm.compression == "none"
    if rank == 0:
        with open(os.path.join(out, "seen"), "w") as fh:
            fh.write(",".join(seen))


def _accumulation(rank: int) -> None:
    """k micro-batches under no_sync (all but the last) give the same update as one k-times larger batch, also
    while the gradient stamps switch from every parameter to the last one (reset() before each micro-step's
    backward, as the loop does)."""
    counter = itertools.count()
    for compression in ("none", "powersgd"):
        comm = GradientComm(lambda: next(counter))
        accum = DistributedDataParallel(_model())
        comm.attach(accum, compression)
        whole = DistributedDataParallel(_model())
        for step in range(3):
            micro = [_batch(rank, 10 * step + i) for i in range(2)]
            for i, x in enumerate(micro):
                last = i == len(micro) - 1
                comm.reset()
                if last:
                    loss = (accum(x) ** 2).sum() / len(micro)
                    loss.backward()
                else:
                    with accum.no_sync():
                        ((accum(x) ** 2).sum() / len(micro)).backward()
                assert comm.ready_count == comm.hooked > 0
            ((whole(torch.cat(micro)) ** 2).sum() / len(micro)).backward()
            for a, b in zip(accum.parameters(), whole.parameters(), strict=True):
                if compression == "none" or step == 0:  # PowerSGD waits for DDP's buckets: step 0 is exact
                    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
                a.grad = None
                b.grad = None
        assert comm.hooked == 1  # learned within the 6 micro-steps, with either compression


def _powersgd_many_buckets(rank: int) -> None:
    """PowerSGD over several buckets: every rank issues its collectives in the same order (gloo would abort) and
    ends each step with the same compressed gradients."""
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(*[nn.Linear(128, 128) for _ in range(6)]), bucket_cap_mb=0.07)
    comm = GradientComm(lambda: 0)
    comm.attach(model, "powersgd", powersgd_rank=2)
    for step in range(12):
        model(_batch(rank, step).repeat(1, 8)).square().mean().backward()
        # every bucket's collectives paired up: each rank holds the same low-rank mean of each weight's gradient
        for p in model.parameters():
            theirs = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
            dist.all_gather(theirs, p.grad)
            torch.testing.assert_close(theirs[0], theirs[1], rtol=0, atol=0)
            if p.dim() == 2 and step > 0:  # DDP's first step (bucket rebuild) is all-reduced uncompressed
                assert 0 < torch.linalg.matrix_rank(p.grad).item() <= 2, (step, torch.linalg.matrix_rank(p.grad))
        model.zero_grad(set_to_none=True)


def _two_ranks(rank: int, world_size: int, out: str) -> None:
    dist.init_process_group("gloo")
    _switching(rank, out)
    _accumulation(rank)
    _powersgd_many_buckets(rank)
    dist.destroy_process_group()


@pytest.mark.slow
def test_stamps_switching_and_accumulation_parity(tmp_path) -> None:
    """One pair of processes for both parts (starting them is most of the time)."""
    run_ranks(_two_ranks, 2, str(tmp_path))
    assert (tmp_path / "seen").read_text() == "none,fp16,bf16,powersgd,powersgd,none"


def test_changes_numerics() -> None:
    assert [changes_numerics(c) for c in COMPRESSIONS] == [False, True, True, True]
    with pytest.raises(ConfigError, match="compression"):
        changes_numerics("zip")


@pytest.mark.parametrize(("name", "backend", "rank", "message"), [
    ("bf16", "mpi", 1, "compression 'bf16' is not available on backend 'mpi'"),
    ("fp16", "mpi", 1, "compression 'fp16' is not available on backend 'mpi'"),
    ("powersgd", "gloo", 5, "powersgd_rank must be one of 1, 2, 3, 4, got 5"),
    ("zstd", "gloo", 1, "compression must be one of none, fp16, bf16, powersgd, got 'zstd'"),
])
def test_check_compression_rejects(name: str, backend: str, rank: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        check_compression(name, backend, rank)
    assert "\n" not in str(info.value)


def _refused(backend: str) -> list[str]:
    refused = []
    for name in COMPRESSIONS:
        try:
            check_compression(name, backend, 4)
        except ConfigError:
            refused.append(name)
    return refused


def test_gloo_takes_every_compression_where_mpi_has_no_16_bit_floats() -> None:
    assert _refused("gloo") == []
    assert _refused("mpi") == ["fp16", "bf16"]


def test_set_compression_before_attach_only_records() -> None:
    comm = GradientComm(lambda: 0)
    comm.set_compression("powersgd", powersgd_rank=2)
    assert (comm.compression, comm.powersgd_rank, comm.attached) == ("powersgd", 2, False)
    with pytest.raises(ConfigError):
        comm.set_compression("fp8")
    assert comm.compression == "powersgd"


def _single() -> DistContext:
    return DistContext(rank=0, local_rank=0, world_size=1, local_world_size=1, node="here",
                       device=torch.device("cpu"), backend=None, owns_group=False)


def test_fsdp_with_compression_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="compression 'fp16' needs strategy ddp: strategy fsdp"):
        wrap_model(nn.Linear(2, 2), _single(), "fsdp", None, compression="fp16")


def test_one_process_is_not_wrapped_and_not_attached() -> None:
    comm = GradientComm(lambda: 0)
    module = nn.Linear(2, 2)
    assert wrap_model(module, _single(), "ddp", comm, compression="fp16") is module
    assert not comm.attached


# -- which parameter is stamped: learned, then watched (one process, no DDP) -----------------------------------


class _Layers(nn.Module):
    """Three WIDTH-wide Linear layers applied in ``self.order`` (layer indices; leaving one out skips it). In
    ``parameters()`` layer i's weight is parameter 2i and its bias 2i + 1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(3)])
        self.order = [0, 1, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in self.order:
            x = torch.tanh(self.layers[i](x))
        return x


class _Stamped:
    """A GradientComm hooked on ``_Layers`` directly, and what every parameter hook would have seen.

    The test's own hooks (registered first, so each runs before the GradientComm's on the same parameter) note the
    order in which the backward accumulates the parameters; the mark is (gradients accumulated so far, the
    parameter just accumulated), so ``comm.last_ready`` says which parameter was stamped and whether it was the
    backward's last gradient: with every parameter hooked the last stamp is ``(len(order), order[-1])``.
    """

    def __init__(self, net: nn.Module | None = None, **kwargs: int) -> None:
        self.net = net if net is not None else _Layers()
        self.order: list[int] = []
        params = list(self.net.parameters())
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self.order.append(i))
        self.comm = GradientComm(lambda: (len(self.order), self.order[-1]), **kwargs)
        self.comm._hook_parameters(params)

    def step(self) -> tuple[int, int]:
        """One backward as the loop makes it (reset() first); the last stamp every hook would have given."""
        self.comm.reset()
        self.order.clear()
        self.net.zero_grad(set_to_none=True)
        self.net(torch.ones(4, WIDTH)).square().sum().backward()
        return len(self.order), self.order[-1]


def test_stamps_learn_the_last_parameter_then_hook_it_alone() -> None:
    s = _Stamped()
    hooked = []
    for _ in range(6):
        last = s.step()
        assert last == (6, 0)  # the first layer's weight comes last
        assert s.comm.last_ready == last  # the same last stamp, whether learning or watching
        assert s.comm.ready_count == s.comm.hooked  # every hook stamped once
        hooked.append(s.comm.hooked)
    # the first reset() comes before any backward; two complete backwards ending with parameter 0, then it alone
    assert hooked == [6, 6, 1, 1, 1, 1]


def test_a_single_parameter_and_none() -> None:
    net = nn.Linear(WIDTH, 1, bias=False)
    s = _Stamped(net)
    for _ in range(4):
        assert s.step() == (1, 0)
        assert (s.comm.last_ready, s.comm.ready_count, s.comm.hooked) == ((1, 0), 1, 1)
    empty = GradientComm(lambda: 0)
    empty._hook_parameters([])
    empty.reset()
    assert (empty.hooked, empty.ready_count, empty.last_ready) == (0, 0, None)


def test_a_backward_leaving_the_watched_parameter_out_returns_to_learning() -> None:
    s = _Stamped(relearn_every=10)
    for _ in range(3):
        s.step()
    assert s.comm.hooked == 1
    s.net.order = [1, 2]  # the first layer unused on this step (as with find_unused_parameters)
    assert s.step() == (4, 2)
    assert (s.comm.ready_count, s.comm.last_ready) == (0, None)  # no stamp: the timer ends compute at backward's end
    s.net.order = [0, 1, 2]
    assert s.step() == (6, 0)
    assert (s.comm.hooked, s.comm.ready_count, s.comm.last_ready) == (6, 6, (6, 0))  # every parameter again
    for _ in range(2):
        assert s.step() == s.comm.last_ready == (6, 0)
    assert s.comm.hooked == 1  # learned again
    # A second miss in a row: every parameter stays hooked until the next attempt, RELEARN_EVERY backwards later.
    s.net.order = [1, 2]
    s.step()
    assert s.comm.ready_count == 0
    s.net.order = [0, 1, 2]
    hooked = []
    for _ in range(13):
        assert s.step() == s.comm.last_ready == (6, 0)
        assert s.comm.ready_count == s.comm.hooked
        hooked.append(s.comm.hooked)
    # the attempt starts from the 10th such backward and needs one more
    assert hooked == [6] * 11 + [1, 1]


def test_a_changed_graph_that_skips_the_first_layer_for_good_keeps_every_hook() -> None:
    s = _Stamped(relearn_every=10)
    for _ in range(3):
        s.step()
    s.net.order = [1, 2]
    s.step()  # the miss
    for _ in range(30):
        last = s.step()
        assert last == (4, 2)
        # four of the six hooked parameters get a gradient: never a complete backward to learn from
        assert (s.comm.hooked, s.comm.ready_count, s.comm.last_ready) == (6, 4, last)


def test_periodic_relearning_catches_a_new_last_parameter() -> None:
    s = _Stamped(relearn_every=5)
    for _ in range(3):
        s.step()
    assert s.comm.hooked == 1
    s.net.order = [1, 0, 2]  # layer 1 first now: its weight (parameter 2) comes last, parameter 0 is still used
    watched = 0
    while s.comm.hooked == 1:
        last = s.step()
        assert last == (6, 2)
        if s.comm.hooked == 1:
            watched += 1
            # what RELEARN_EVERY bounds: the old watched parameter's stamp, earlier than the last gradient
            assert s.comm.last_ready == (4, 0)
    assert watched == 4  # watched for 5 backwards (one before the change), then every parameter hooked again
    for _ in range(5):
        assert s.step() == s.comm.last_ready == (6, 2)
    assert s.comm.hooked == 1


def test_a_dynamic_order_never_settles_on_a_wrong_parameter() -> None:
    s = _Stamped(relearn_every=7)
    rotations = [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    for step in range(60):
        s.net.order = rotations[step % 3]
        last = s.step()
        assert last == (6, 2 * s.net.order[0])
        assert (s.comm.hooked, s.comm.ready_count, s.comm.last_ready) == (6, 6, last)


def test_detach_removes_every_hook() -> None:
    for backwards in (1, 4):  # detach while learning, and while watching
        s = _Stamped()
        for _ in range(backwards):
            s.step()
        assert s.comm.hooked == (6 if backwards == 1 else 1)
        s.comm.detach()
        assert s.comm.hooked == 0
        for _ in range(3):
            s.step()
            assert (s.comm.hooked, s.comm.ready_count, s.comm.last_ready) == (0, 0, None)
        assert all(len(p._post_accumulate_grad_hooks) == 1 for p in s.net.parameters())  # the test's own only
