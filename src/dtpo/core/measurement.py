"""A number with its unit and where it came from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Source = Literal["measured", "estimated", "derived", "datasheet"]


@dataclass(frozen=True)
class Measurement:
    """One reported figure.

    Attributes:
        value: The number, or ``None`` when it could not be determined.
        unit: Its unit, e.g. ``"samples/s"``, ``"s"``, ``"J"``, ``"fraction"``.
        source: ``"measured"`` (read from a clock or a hardware counter), ``"estimated"`` (from a model),
            ``"derived"`` (computed only from measured figures) or ``"datasheet"`` (a vendor specification).
        note: Optional detail, e.g. how a peak was obtained or why the value is missing.
    """

    value: float | None
    unit: str
    source: Source = "measured"
    note: str = ""

    @property
    def estimated(self) -> bool:
        """Whether the figure comes from a model rather than a counter or clock."""
        return self.source == "estimated"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        if not self.note:
            out.pop("note")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of :meth:`to_dict`."""
        return cls(data["value"], data["unit"], data.get("source", "measured"), data.get("note", ""))
