"""Switches alone: settings change with a log entry, a probe's setting comes and goes, state round-trips."""

from __future__ import annotations

import logging
import time

import pytest
import torch

from dtpo.core.config import SessionConfig
from dtpo.core.errors import ConfigError
from dtpo.distributed.comm_timing import GradientComm
from dtpo.session.loop.switches import Switches

CPU = torch.device("cpu")


def _switches(comm: bool = False, **config: object) -> Switches:
    return Switches(SessionConfig(**config), CPU, GradientComm(time.perf_counter) if comm else None, world_size=2)


def test_a_change_is_logged_at_its_step_and_a_repeat_is_not() -> None:
    switches = _switches(grad_accum=2)
    assert switches.current()["grad_accum"].value == 2 and not switches.current()["grad_accum"].changes_numerics
    switches.set_precision("bf16-mixed", 4)
    switches.set_precision("bf16-mixed", 5)
    switches.set_grad_accum(3, 6)
    assert switches.precision.name == "bf16-mixed" and switches.current()["precision"].changes_numerics
    assert switches.current()["grad_accum"].changes_numerics
    assert switches.log == [{"step": 4, "setting": "precision", "value": "bf16-mixed"},
                            {"step": 6, "setting": "grad_accum", "value": 3}]


def test_accumulation_at_a_fixed_global_batch_keeps_the_loader_batches() -> None:
    switches = _switches(grad_accum=2)
    switches.set_grad_accum(4, 1, keep_global_batch=True)
    assert (switches.grad_accum, switches.loader_batches) == (4, 2)
    switches.set_grad_accum(1, 2)
    assert (switches.grad_accum, switches.loader_batches) == (1, 1)
    with pytest.raises(ConfigError, match="integer >= 1"):
        switches.set_grad_accum(0, 3)


def test_compression_needs_gradient_communication() -> None:
    switches = _switches()
    switches.set_compression("none", 0)
    assert switches.log == []
    with pytest.raises(ConfigError, match="needs DDP with more than one process"):
        switches.set_compression("fp16", 0)


def test_a_probe_setting_is_put_back_afterwards_and_logged_nowhere() -> None:
    switches = _switches(comm=True)
    switches.set_compression("powersgd", 1, 2)
    before = switches.precision
    with switches.trying("bf16-mixed", "fp16", 1):
        assert switches.precision.name == "bf16-mixed"
        assert switches.comm is not None and switches.comm.compression == "fp16"
    assert switches.precision is before
    assert (switches.comm.compression, switches.comm.powersgd_rank) == ("powersgd", 2)
    assert switches.log == [{"step": 1, "setting": "compression", "value": "powersgd-2"}]


def test_state_round_trips_through_the_set_methods_without_announcing(caplog: pytest.LogCaptureFixture) -> None:
    saved = _switches(comm=True, grad_accum=2)
    saved.set_grad_accum(4, 3, keep_global_batch=True)
    saved.set_precision("bf16-mixed", 5)
    saved.set_compression("fp16", 7)
    restored = _switches(comm=True, grad_accum=2)
    restored.announce = True
    with caplog.at_level(logging.INFO, logger="dtpo.session.session"):
        restored.load_state_dict(saved.state_dict())
    assert restored.state_dict() == saved.state_dict()
    assert (restored.grad_accum, restored.loader_batches, restored.precision.name) == (4, 2, "bf16-mixed")
    assert restored.log == saved.log and restored.log is not saved.log
    assert not caplog.records and restored.announce


def test_the_values_a_window_records_are_those_of_the_current_switches() -> None:
    switches = _switches(comm=True, grad_accum=2)
    assert switches.values() == {name: switch.value for name, switch in switches.current().items()}
    switches.set_precision("bf16-mixed", 1)
    switches.set_grad_accum(3, 1)
    switches.set_compression("fp16", 1)
    assert switches.values() == {"precision": "bf16-mixed", "grad_accum": 3, "compression": "fp16"}
    assert list(switches.values()) == list(switches.current())
    assert _switches().values()["compression"] == "none"  # no DDP communication: nothing compressed


def test_the_autocast_hook_runs_once_when_a_mixed_precision_first_comes_in_force() -> None:
    calls: list[str] = []
    switches = _switches()
    switches.when_autocast(lambda: calls.append(switches.precision.name))
    switches.set_grad_accum(2, 1)
    assert calls == []  # 32-true: nothing to install
    with switches.trying("bf16-mixed", "none", 1):  # a probe in a mixed precision needs it too
        assert calls == ["bf16-mixed"]
    switches.set_precision("16-mixed", 3)
    switches.set_precision("32-true", 4)
    switches.set_precision("bf16-mixed", 5)
    assert calls == ["bf16-mixed"]  # once: what it installs follows the precision itself


def test_the_autocast_hook_runs_at_once_when_the_run_starts_mixed() -> None:
    calls: list[int] = []
    _switches(precision="bf16-mixed").when_autocast(lambda: calls.append(1))
    assert calls == [1]
