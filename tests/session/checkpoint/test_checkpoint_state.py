"""A rank's own state as one DCP item (as checkpoints before RankState wrote it), and the data position."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from dtpo.core.errors import ConfigError
from dtpo.session.checkpoint.state import DataPosition, Opaque, RankState


def _quiet_save(state: dict[str, Any], path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path), no_dist=True)


def _quiet_load(state: dict[str, Any], path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)


def test_a_rank_state_is_one_item_and_reads_what_an_opaque_item_wrote(tmp_path: Path) -> None:
    value = {"step": 3, "session": {"precision": "32-true"}, "callbacks": {"A#0": [1, 2]}}
    _quiet_save({"rank0": RankState(value)}, tmp_path / "new")
    _quiet_save({"rank0": Opaque(value)}, tmp_path / "old")  # what dtpo.checkpoint/1 writers did before
    for name in ("new", "old"):
        metadata = dcp.FileSystemReader(str(tmp_path / name)).read_metadata().state_dict_metadata
        assert list(metadata) == ["rank0"] and isinstance(metadata["rank0"], BytesStorageMetadata)
        loaded = RankState()
        _quiet_load({"rank0": loaded}, tmp_path / name)
        assert loaded.value == value


class _Stateful:
    """An iterable with its own position (as torchdata's StatefulDataLoader)."""

    def __init__(self) -> None:
        self.start = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.start, 100))

    def state_dict(self) -> dict[str, int]:
        return {"start": 7}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["start"]


def test_the_data_position_replays_or_asks_the_iterable() -> None:
    position = DataPosition()
    iterator = position.iterate(range(10))
    assert [next(iterator) for _ in range(3)] == [0, 1, 2] and position.state_dict() == {"batches": 3, "state": None}
    position.load_state_dict({"batches": 4, "state": None})
    assert next(position.iterate(range(10))) == 4 and position.consumed == 5
    data = _Stateful()
    position.iterate(data)
    saved = position.state_dict()
    assert saved == {"batches": 0, "state": {"start": 7}}
    position.load_state_dict(saved)
    assert next(position.iterate(_Stateful())) == 7


def test_replaying_past_the_end_of_the_data_is_one_line() -> None:
    position = DataPosition()
    position.load_state_dict({"batches": 5, "state": None})
    with pytest.raises(ConfigError, match="the data ended after 2 batches while replaying the 5 batches before"):
        position.iterate(range(2))
