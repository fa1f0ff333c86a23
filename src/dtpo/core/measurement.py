"""A number with its unit and where it came from.

A :class:`Measurement` never holds NaN or infinity: a non-finite value is stored as ``None`` (unknown) and
the note says what it was, so a bad reading can reach neither a record nor a sum. This holds both for
figures built in code and for figures loaded from a file.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["measured", "estimated", "derived", "datasheet"]
SOURCES: tuple[str, ...] = ("measured", "estimated", "derived", "datasheet")
_FIELDS = ("value", "unit", "source", "note")


@dataclass(frozen=True)
class Measurement:
    """One reported figure.

    Attributes:
        value: The number, or ``None`` when it could not be determined. NaN and infinity become ``None``
            with a note naming them (see the module docstring).
        unit: Its unit, e.g. ``"samples/s"``, ``"s"``, ``"J"``, ``"fraction"``.
        source: ``"measured"`` (read from a clock or a hardware counter), ``"estimated"`` (from a model),
            ``"derived"`` (computed only from measured figures) or ``"datasheet"`` (a vendor specification).
        note: Optional detail, e.g. how a peak was obtained or why the value is missing.
    """

    value: float | None
    unit: str
    source: Source = "measured"
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown measurement source {self.source!r} (choose from: {', '.join(SOURCES)})")
        value = self.value
        if value is None or isinstance(value, bool):
            return
        if not isinstance(value, numbers.Real):
            raise TypeError(f"a measurement's value must be a number or None, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            why = f"not a finite number ({value!r})"
            object.__setattr__(self, "value", None)
            object.__setattr__(self, "note", f"{self.note}; {why}" if self.note else why)

    @property
    def estimated(self) -> bool:
        """Whether the figure comes from a model rather than a counter or clock."""
        return self.source == "estimated"

    @property
    def known(self) -> bool:
        """Whether the figure has a value."""
        return self.value is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``note`` left out when empty)."""
        out: dict[str, Any] = {"value": self.value, "unit": self.unit, "source": self.source}
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of :meth:`to_dict`."""
        return cls(data["value"], data["unit"], data.get("source", "measured"), data.get("note", ""))

    # Read access by key, so code written against the JSON form (``totals["mfu"]["value"]``) keeps working.

    def __getitem__(self, key: str) -> Any:
        """``m["value"]`` is ``m.value`` (likewise ``unit``, ``source``, ``note``), as in the JSON form."""
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """``m.get("note")``, as on the JSON form (``default`` for an empty note or an unknown key)."""
        if key not in _FIELDS or (key == "note" and not self.note):
            return default
        return getattr(self, key)


def measurement_or_none(data: dict[str, Any] | Measurement | None) -> Measurement | None:
    """A measurement from its JSON form (or itself), ``None`` for ``None``."""
    if data is None or isinstance(data, Measurement):
        return data
    return Measurement.from_dict(data)
