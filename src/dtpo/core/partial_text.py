"""A rank's partial record as compact JSON, with each step and energy window encoded once however often the record
is rewritten.

A rank rewrites its whole partial record while it trains (:mod:`dtpo.session.lifecycle`), atomically, so a crash
leaves a readable file. Encoding its steps anew each time made a flush cost grow with the run (6-10 us per
recorded step, by machine: 13-19 ms at 2,000 steps, 1-2 s at 200,000), and its energy windows, one per ten steps by
default, about as much again per window (2-3 ms of a flush at 200 windows). Neither changes once recorded (a
step's tail is split into wait and exposed communication at the end, after the last flush), so
:class:`PartialRecordText` keeps the text of the steps and windows already encoded and encodes only those added
since: a flush then encodes the rest of the record and joins their text, a copy of memory. The file is the same JSON
a full encoding writes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dtpo.core.record import RunRecord, StepRecord

_COMPACT = (",", ":")


class _GrowingList:
    """The JSON text of one list that only grows, each item encoded once.

    The list is recognised as the same list grown when its last item encoded is still in its place; any other list
    (items replaced or cut, as a resume may do) is encoded afresh.

    Args:
        as_json: What an item is encoded as (a JSON-ready value); ``None``: the item itself.
    """

    def __init__(self, as_json: Callable[[Any], Any] | None = None) -> None:
        self.as_json = as_json
        self._chunks: list[str] = []  # the encoded items, comma-joined within each chunk, without brackets
        self._count = 0  # items encoded
        self._last: Any = None  # the last item encoded
        # stands for the list while the rest is encoded: no string a record holds is encoded this way by chance
        self.marker = f"\x00list-{uuid.uuid4().hex}"
        self.marker_text = json.dumps(self.marker)

    def text(self, items: list[Any]) -> str:
        """``items`` as compact JSON."""
        count = self._count
        if count > len(items) or (count and items[count - 1] is not self._last):
            self._chunks, count = [], 0
        if len(items) > count:
            new = items[count:] if self.as_json is None else [self.as_json(item) for item in items[count:]]
            self._chunks.append(json.dumps(new, separators=_COMPACT)[1:-1])
            self._count, self._last = len(items), items[-1]
        return "[" + ",".join(self._chunks) + "]"


class PartialRecordText:
    """Encodes one rank's partial record again and again as its steps and energy windows grow, each once."""

    def __init__(self) -> None:
        self._steps = _GrowingList(StepRecord.to_dict)
        self._windows = _GrowingList()  # plain dicts, as the energy callback records them

    def encode(self, record: RunRecord) -> str:
        """``record`` (a partial record: one rank) as compact JSON, the same text ``json.dumps(record.to_dict())``
        gives with compact separators.

        Raises:
            ValueError: ``record`` does not hold exactly one rank.
        """
        if len(record.ranks) != 1:
            raise ValueError(f"a partial record holds one rank, not {len(record.ranks)}")
        rank = record.ranks[0]
        steps_text = self._steps.text(rank.steps)
        energy = rank.energy
        windows = energy.get("windows") if isinstance(energy, dict) else None
        windows_text = None
        if isinstance(windows, list):
            windows_text = self._windows.text(windows)
            energy = {**energy, "windows": self._windows.marker}  # the same keys in the same order
        data = replace(record, ranks=[replace(rank, steps=[], energy=energy)]).to_dict()
        data["ranks"][0]["steps"] = self._steps.marker
        text = json.dumps(data, separators=_COMPACT).replace(self._steps.marker_text, steps_text, 1)
        return text if windows_text is None else text.replace(self._windows.marker_text, windows_text, 1)
