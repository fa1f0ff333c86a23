"""Reading the run store: ``--filter`` texts as SQL, and two runs side by side (:class:`Comparison`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.telemetry.store.figures import Figure
from dtpo.telemetry.store.rows import StoredRun

FILTER_KEYS = ("id", "name", "kind", "status", "workload", "workers", "steps", "parent", "hostname", "run_dir",
               "started_at", "finished_at", "error")
"""Keys ``--filter`` takes, besides ``config.SECTION.FIELD``."""
_INTEGER_KEYS = ("workers", "steps")
_OPERATORS = ("!=", ">=", "<=", "=", ">", "<")


@dataclass(frozen=True)
class FigureDiff:
    """One figure of two runs side by side.

    Attributes:
        name: The figure's name.
        a: The first run's figure (``None`` if it has none).
        b: The second run's.
    """

    name: str
    a: Figure | None
    b: Figure | None

    @property
    def difference(self) -> float | None:
        """``b - a``, when both are known."""
        if self.a is None or self.b is None or self.a.value is None or self.b.value is None:
            return None
        return self.b.value - self.a.value

    @property
    def relative(self) -> float | None:
        """``(b - a) / |a|``, when both are known and ``a`` is not zero."""
        diff = self.difference
        if diff is None or not self.a or not self.a.value:
            return None
        return diff / abs(self.a.value)

    @property
    def estimated(self) -> bool:
        """Whether either side is estimated."""
        return any(f is not None and f.estimated for f in (self.a, self.b))

    @property
    def unit(self) -> str:
        """The unit (of whichever side has the figure)."""
        return (self.a or self.b).unit if (self.a or self.b) else ""


@dataclass
class Comparison:
    """Two runs side by side: every figure either has, and the configuration keys that differ.

    Attributes:
        a: The first run.
        b: The second run.
        figures: One entry per figure name, in the first run's order then the second's.
        config: ``(dotted key, value in a, value in b)`` for every key whose values differ.
    """

    a: StoredRun
    b: StoredRun
    figures: list[FigureDiff]
    config: list[tuple[str, Any, Any]]


CONFIG_KEYS_ALWAYS_DIFFERENT = ("launch.run_dir",)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def config_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The dotted keys whose values differ between two configurations (``None`` where one lacks the key)."""
    fa, fb = flatten(a), flatten(b)
    keys = [k for k in dict.fromkeys([*fa, *fb]) if k not in CONFIG_KEYS_ALWAYS_DIFFERENT]
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]


def parse_filter(text: str) -> tuple[str, str, str]:
    """``"status=completed"`` -> ``("status", "=", "completed")``; operators ``= != > < >= <=``.

    Raises:
        ConfigError: No operator, or a key the store cannot filter on.
    """
    for op in _OPERATORS:
        key, sep, value = text.partition(op)
        if sep and key.strip() and ("=" not in key and "<" not in key and ">" not in key and "!" not in key):
            key = key.strip()
            if key not in FILTER_KEYS and not (key.startswith("config.") and len(key) > len("config.")):
                raise ConfigError(f"--filter {text!r}: unknown key {key!r} (choose from: {', '.join(FILTER_KEYS)}, "
                                 "or config.SECTION.FIELD)")
            return key, op, value.strip()
    raise ConfigError(f"--filter must be KEY=VALUE (also !=, >, <, >=, <=), e.g. status=completed; got {text!r}")


def filter_sql(filters: Sequence[str]) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (and its parameters) of ``--filter`` texts, all of which must hold."""
    clauses, params = [], []
    for text in filters:
        key, op, value = parse_filter(text)
        if key.startswith("config."):
            path = key.removeprefix("config.")
            if not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", path):
                raise ConfigError(f"--filter {text!r}: config keys are SECTION.FIELD, e.g. config.session.precision")
            column = f"json_extract(config, '$.{path}')"
        else:
            column = key
        param: Any = value
        if key in _INTEGER_KEYS and not _is_number(value):
            raise ConfigError(f"--filter {text!r}: {key} is a number")
        if key in _INTEGER_KEYS or key.startswith("config.") and _is_number(value):
            param = float(value)
        elif key.startswith("config.") and value.lower() in ("true", "false"):
            param = 1 if value.lower() == "true" else 0
        if value.lower() in ("none", "null", "") and op in ("=", "!="):
            clauses.append(f"{column} IS {'NOT ' if op == '!=' else ''}NULL")
            continue
        pattern = op in ("=", "!=") and isinstance(param, str) and ("*" in value or "?" in value)
        if op == "=":
            clauses.append(f"{column} {'GLOB' if pattern else '='} ?")
        elif op == "!=":
            clauses.append(f"({column} IS NULL OR {column} {'NOT GLOB' if pattern else '!='} ?)")
        else:
            clauses.append(f"{column} {op} ?")
        params.append(param)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
