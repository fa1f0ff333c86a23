"""Which optimizer steps are iterations, and which loader is the training loader."""

from __future__ import annotations

from dtpo.agent.step_counter import LoaderChoice, StepCounter


def test_only_the_outermost_step_of_wrapped_optimizers_counts() -> None:
    counter = StepCounter()
    outer, inner = object(), object()
    ends = []
    for _ in range(3):  # a ZeroRedundancyOptimizer / EMA wrapper calling its inner optimizer's step()
        counter.enter(outer)
        counter.enter(inner)
        ends.append(counter.leave())
        ends.append(counter.leave())
    assert ends == [False, True] * 3
    assert counter.counts[id(outer)] == 3 and id(inner) not in counter.counts


def test_a_skipped_scaler_step_still_counts() -> None:
    """GradScaler.step(opt) that found inf/NaN gradients never calls opt.step(): the iteration happened."""
    counter = StepCounter()
    opt = object()
    counter.enter(opt)  # GradScaler.step: stepped
    counter.enter(opt)
    assert counter.leave() is False
    assert counter.leave() is True
    counter.enter(opt)  # GradScaler.step: skipped
    assert counter.leave() is True
    assert counter.counts[id(opt)] == 2


def test_with_several_optimizers_the_one_that_steps_most_is_the_clock() -> None:
    counter = StepCounter()
    generator, discriminator = object(), object()
    ticks = []
    for _ in range(4):  # a GAN: the discriminator steps twice per generator step
        for opt in (discriminator, discriminator, generator):
            counter.enter(opt)
            ticks.append((opt is discriminator, counter.leave()))
    assert counter.clock == id(discriminator)
    assert [tick for is_d, tick in ticks if not is_d] == [False] * 4
    assert sum(tick for _, tick in ticks) == 8


def test_a_leave_without_enter_is_ignored() -> None:
    assert StepCounter().leave() is False


def test_the_loader_of_the_last_batch_before_an_iteration_is_the_training_loader() -> None:
    choice = LoaderChoice()
    assert choice.counts("val")  # before the first iteration any batch counts
    choice.yielded("val")  # a sanity-check pass on the validation loader
    choice.yielded("train")
    choice.step_ended()
    assert choice.training == "train"
    assert choice.counts("train") and not choice.counts("val")
    choice.yielded("val")  # evaluation between iterations
    choice.yielded("train")
    choice.step_ended()
    assert choice.training == "train"


def test_a_script_that_moves_to_another_training_loader_is_followed() -> None:
    choice = LoaderChoice()
    choice.yielded("phase1")
    choice.step_ended()
    choice.yielded("phase2")  # an iteration that got no batch of the old loader
    choice.step_ended()
    assert choice.training == "phase2"
