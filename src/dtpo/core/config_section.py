"""The machinery under :mod:`dtpo.core.config`'s sections: the flag a field is set by, the documentation
string under each field, and the value checks that name the failing field and its flag."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
from typing import Any, ClassVar

from dtpo.core.errors import ConfigError

__all__ = ["Section", "field_docs", "flag", "kind_name"]


def flag(name: str, *, short: str | None = None) -> dict[str, Any]:
    """Field metadata naming the field's command-line flag, e.g. ``field(default=1, metadata=flag("--steps"))``."""
    return {"flag": name, "short": short}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The documentation string written right under each field of a dataclass, by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


class Section:
    """Shared checks of the config sections; each names the failing field as ``section.field (--flag)``."""

    SECTION: ClassVar[str] = ""

    def _fail(self, name: str, problem: str) -> ConfigError:
        meta = next((f.metadata for f in dataclasses.fields(self) if f.name == name), {})  # type: ignore[arg-type]
        hint = f" ({meta['flag']})" if meta.get("flag") else ""
        return ConfigError(f"{self.SECTION}.{name} {problem}{hint}")

    def _check_type(self, name: str, kind: type, optional: bool) -> Any:
        value = getattr(self, name)
        if value is None and optional:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(self, name, value)
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if not ok:
            raise self._fail(name, f"must be {kind_name(kind)}{' or null' if optional else ''}, got {value!r}")
        if kind is float and not math.isfinite(value):
            raise self._fail(name, f"must be a finite number, got {value!r}")
        return value

    def _int(self, name: str, low: int, high: int | None = None, optional: bool = False) -> None:
        value = self._check_type(name, int, optional)
        if value is None:
            return
        if value < low:
            raise self._fail(name, f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise self._fail(name, f"must be <= {high:,}, got {value:,}")

    def _float(self, name: str, *, positive: bool = False, minimum: float | None = None,
               maximum: float | None = None, optional: bool = False) -> None:
        value = self._check_type(name, float, optional)
        if value is None:
            return
        if positive and value <= 0:
            raise self._fail(name, f"must be positive, got {value:g}")
        if minimum is not None and value < minimum:
            raise self._fail(name, f"must be >= {minimum:g}, got {value:g}")
        if maximum is not None and value > maximum:
            raise self._fail(name, f"must be <= {maximum:g}, got {value:g}")

    def _choice(self, name: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise self._fail(name, f"must be one of {', '.join(choices)}, got {value!r}")

    def _bool(self, name: str) -> None:
        self._check_type(name, bool, False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def kind_name(kind: type) -> str:
    """How an error message names a value type (``an integer``, ``a number``, ...)."""
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, kind.__name__)
