"""A rank's partial record as compact JSON, with each step encoded once however often the record is rewritten.

A rank rewrites its whole partial record while it trains (:mod:`dtpo.session.lifecycle`), atomically, so a crash
leaves a readable file. Encoding its steps anew each time made a flush cost grow with the run (6-10 us per
recorded step, by machine: 13-19 ms at 2,000 steps, 1-2 s at 200,000). Steps do not change once recorded (the
tail's split into wait and exposed communication is filled in at the end, after the last flush), so
:class:`PartialRecordText` keeps the text of the steps already encoded and encodes only those added since: a
flush then encodes the rest of the record (its energy windows grow ten times slower) and joins the steps' text,
a copy of memory. The file is the same JSON a full encoding writes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

from dtpo.core.record import RunRecord, StepRecord

_COMPACT = (",", ":")


class PartialRecordText:
    """Encodes one rank's partial record again and again as its steps grow, each step once.

    The steps are recognised as the same list grown when the last one encoded is still in its place; any other
    list (steps replaced or cut, as a resume may do) is encoded afresh.
    """

    def __init__(self) -> None:
        self._chunks: list[str] = []  # the encoded steps, comma-joined within each chunk, without brackets
        self._count = 0  # steps encoded
        self._last: StepRecord | None = None  # the last step encoded
        # stands for the steps while the rest is encoded: no string a record holds is encoded this way by chance
        self._marker = f"\x00steps-{uuid.uuid4().hex}"
        self._marker_text = json.dumps(self._marker)

    def encode(self, record: RunRecord) -> str:
        """``record`` (a partial record: one rank) as compact JSON, the same text ``json.dumps(record.to_dict())``
        gives with compact separators.

        Raises:
            ValueError: ``record`` does not hold exactly one rank.
        """
        if len(record.ranks) != 1:
            raise ValueError(f"a partial record holds one rank, not {len(record.ranks)}")
        rank = record.ranks[0]
        steps_text = self._steps(rank.steps)
        data = replace(record, ranks=[replace(rank, steps=[])]).to_dict()
        data["ranks"][0]["steps"] = self._marker
        return json.dumps(data, separators=_COMPACT).replace(self._marker_text, steps_text, 1)

    def _steps(self, steps: list[StepRecord]) -> str:
        count = self._count
        if count > len(steps) or (count and steps[count - 1] is not self._last):
            self._chunks, count = [], 0
        if len(steps) > count:
            self._chunks.append(json.dumps([s.to_dict() for s in steps[count:]], separators=_COMPACT)[1:-1])
            self._count, self._last = len(steps), steps[-1]
        return "[" + ",".join(self._chunks) + "]"
