"""The built-in workloads build, stream reproducible per-rank batches, and learn."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import pytest
import torch

from dtpo.core.errors import ConfigError
from dtpo.workloads import WORKLOADS, Workload, get_workload
from dtpo.workloads.cnn import SyntheticCNN
from dtpo.workloads.lm import STDLIB_SOURCES, CharLM, LMConfig, corpus

NAMES = sorted(WORKLOADS)


def first(workload: Workload, batch_size: int = 4, rank: int = 0, world_size: int = 2,
          seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return next(workload.batches(batch_size, rank, world_size, seed=seed))


def test_registry_holds_the_three_workloads_under_their_names() -> None:
    # The registry is built from each class's own ``name``: check the names lead to the intended classes
    # (two classes sharing a name would silently leave one out) and that what ``get_workload`` builds is one.
    assert {name: cls.__name__ for name, cls in WORKLOADS.items()} == {
        "cnn": "SyntheticCNN", "lm": "CharLM", "mlp": "SyntheticMLP"}
    for name, cls in WORKLOADS.items():
        workload = get_workload(name)
        assert type(workload) is cls and workload.name == name
        assert cls.description
        assert cls.default_steps > 0 and cls.default_batch_size > 0 and cls.default_lr > 0


def test_unknown_workload_raises_config_error_listing_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown workload 'foo' \(choose from: cnn, lm, mlp\)"):
        get_workload("foo")


@pytest.mark.parametrize("name", NAMES)
def test_batches_and_model_output_have_the_expected_shapes(name: str) -> None:
    workload = get_workload(name)
    inputs, targets = batch = first(workload, batch_size=3)
    assert workload.samples_in(batch) == 3
    assert targets.dtype == torch.int64
    torch.manual_seed(0)
    output = workload.build_model()(inputs)
    loss = workload.loss(output, targets)
    assert loss.ndim == 0 and torch.isfinite(loss)
    if name == "lm":
        t = workload.config.block_size
        assert inputs.shape == targets.shape == (3, t) and inputs.dtype == torch.int64
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next byte
        assert output.shape == (3, t, 256)
    else:
        assert targets.shape == (3,) and inputs.dtype == torch.float32
        assert inputs.shape == ((3, 256) if name == "mlp" else (3, 3, 32, 32))
        assert output.shape == (3, 10)
        assert 0 <= int(targets.min()) and int(targets.max()) < 10


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_and_rank_give_identical_batches(name: str) -> None:
    a, b = get_workload(name).batches(4, 1, 2, seed=7), get_workload(name).batches(4, 1, 2, seed=7)
    for _ in range(3):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("name", NAMES)
def test_ranks_and_seeds_see_different_data(name: str) -> None:
    workload = get_workload(name)
    base = first(workload, rank=0, seed=0)[0]
    assert not torch.equal(base, first(workload, rank=1, seed=0)[0])
    assert not torch.equal(base, first(workload, rank=0, seed=1)[0])


@pytest.mark.parametrize("name", NAMES)
def test_models_are_deterministic_under_manual_seed(name: str) -> None:
    workload = get_workload(name)
    torch.manual_seed(3)
    one = workload.build_model().state_dict()
    torch.manual_seed(3)
    two = workload.build_model().state_dict()
    assert one.keys() == two.keys()
    assert all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("args", [(0, 0, 1), (4, 2, 2), (4, -1, 2)])
def test_bad_batch_arguments_raise_config_error_at_once(name: str, args: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError):
        get_workload(name).batches(*args)


def train_losses(workload: Workload, steps: int, batch_size: int) -> list[float]:
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=workload.default_lr)
    losses = []
    data = workload.batches(batch_size, 0, 1, seed=0)
    for _ in range(steps):
        inputs, targets = next(data)
        loss = workload.loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name, steps, batch_size, drop", [
    ("lm", 60, 16, 1.5),
    ("mlp", 60, 128, 0.6),
    ("cnn", 60, 64, 0.3),
])
@pytest.mark.slow
def test_loss_falls_in_a_short_training_loop(name: str, steps: int, batch_size: int, drop: float) -> None:
    # A smaller LM than the default keeps the test quick; it still has to learn the byte statistics.
    small_lm = CharLM(LMConfig(n_layer=2, n_head=2, d_model=64, block_size=64))
    workload = small_lm if name == "lm" else get_workload(name)
    losses = train_losses(workload, steps, batch_size)
    start, end = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert end < start - drop, f"loss went from {start:.3f} to {end:.3f}"


def test_lm_text_is_standard_library_source_of_useful_size() -> None:
    text = corpus()
    assert text.dtype == torch.uint8 and text.numel() > 500_000
    root = Path(sysconfig.get_paths()["stdlib"])
    head = (root / STDLIB_SOURCES[0]).read_bytes()
    assert bytes(text[: len(head)].tolist()) == head
    assert list(STDLIB_SOURCES) == sorted(STDLIB_SOURCES)


def test_lm_config_rejects_bad_shapes() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        LMConfig(n_head=3, d_model=128)
    with pytest.raises(ConfigError, match="n_layer"):
        LMConfig(n_layer=0)


def test_mlp_teacher_uses_every_class() -> None:
    _, labels = first(get_workload("mlp"), batch_size=10_000)
    assert (torch.bincount(labels, minlength=10) > 300).all()


def test_cnn_labels_are_redrawn_at_the_label_noise_rate_on_the_same_images() -> None:
    clean, noisy = SyntheticCNN(label_noise=0.0), SyntheticCNN(label_noise=0.1)
    a, b = clean.batches(64, 0, 1, seed=3), noisy.batches(64, 0, 1, seed=3)
    changed = total = 0
    for _ in range(50):
        (x_clean, y_clean), (x_noisy, y_noisy) = next(a), next(b)
        assert torch.equal(x_clean, x_noisy)
        changed += int((y_clean != y_noisy).sum())
        total += len(y_clean)
    assert 0.07 < changed / total < 0.11  # a redrawn label lands on the true class one time in ten: 9 %


def test_cnn_loss_floor_is_the_label_entropy() -> None:
    assert SyntheticCNN(label_noise=0.0).loss_floor() == 0.0
    # 10 classes, 10 % redrawn: 0.91 on the true class, 0.01 on each other
    assert abs(SyntheticCNN().loss_floor() - -(0.91 * math.log(0.91) + 9 * 0.01 * math.log(0.01))) < 1e-12
    with pytest.raises(ValueError, match="label_noise"):
        SyntheticCNN(label_noise=1.5)
