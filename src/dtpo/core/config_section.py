"""The machinery under the configuration trees (:mod:`dtpo.core.config` and the commands' own trees): the flag a
field is set by, the documentation string under each field, the value checks that name the failing field and
its flag, and a tree of sections read from and written to nested dicts."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import os
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

from dtpo.core.errors import ConfigError

__all__ = ["ConfigField", "Section", "Tree", "argument", "field_docs", "flag", "kind_name", "tree_fields"]


def flag(name: str, *, short: str | None = None, negatable: bool = True) -> dict[str, Any]:
    """Field metadata naming the field's command-line flag, e.g. ``field(default=1, metadata=flag("--steps"))``.

    Args:
        name: The flag (``"--steps"``).
        short: A one-letter alias (``"-w"``).
        negatable: For a true/false field: also a ``--no-...`` flag (``False``: the flag only switches it on).
    """
    return {"flag": name, "short": short, "negatable": negatable}


def argument() -> dict[str, Any]:
    """Field metadata making the field the command's positional argument (named after the field)."""
    return {"flag": None, "short": None, "argument": True}


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

    def _optional_number(self, name: str) -> float | None:
        """A float field that may be null (an integer is taken as a number); unlike :meth:`_check_type` it leaves
        a non-finite value for the section's own rules to name in their words."""
        value = getattr(self, name)
        if isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(self, name, value)
        if value is not None and not isinstance(value, float):
            raise self._fail(name, f"must be a number or null, got {value!r}")
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

    def _path(self, name: str) -> None:
        """A path field: ``None``, or a path (a string, as read from a file, becomes a :class:`Path`)."""
        value = getattr(self, name)
        if value is None or isinstance(value, Path):
            return
        if not isinstance(value, str | os.PathLike):
            raise self._fail(name, f"must be a path or null, got {value!r}")
        setattr(self, name, Path(value))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as strings)."""
        return {name: str(value) if isinstance(value, Path) else value
                for name, value in dataclasses.asdict(self).items()}  # type: ignore[call-overload]


class Tree:
    """The root of a configuration tree: one field per section, each a :class:`Section` named in ``SECTIONS``.

    Subclasses are keyword-only dataclasses; their rules that read several sections at once go in
    ``_check_rules`` (run by ``__post_init__`` after every section checked its own values).
    """

    SECTIONS: ClassVar[dict[str, type[Section]]] = {}
    SCHEMA: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        for name, cls in self.SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        self._check_rules()

    def _check_rules(self) -> None:
        """Rules across sections; each raises a one-line :class:`ConfigError`."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with the schema version, where the tree has one)."""
        head = {"schema": self.SCHEMA} if self.SCHEMA else {}
        return {**head, **{name: getattr(self, name).to_dict() for name in self.SECTIONS}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build (and validate) a tree from nested dicts; unknown sections or fields are errors."""
        if not isinstance(data, dict):
            raise ConfigError(f"a run configuration must be a mapping, got {type(data).__name__}")
        data = dict(data)
        if cls.SCHEMA:
            schema = data.pop("schema", cls.SCHEMA)
            if schema != cls.SCHEMA:
                raise ConfigError(f"unsupported configuration schema {schema!r} (this dtpo reads {cls.SCHEMA})")
        unknown = sorted(set(data) - set(cls.SECTIONS))
        if unknown:
            raise ConfigError(f"unknown configuration section(s): {', '.join(unknown)} "
                              f"(known: {', '.join(cls.SECTIONS)})")
        sections = {}
        for name, section_cls in cls.SECTIONS.items():
            values = data.get(name, {})
            if not isinstance(values, dict):
                raise ConfigError(f"{name} must be a mapping of settings, got {values!r}")
            known = {f.name for f in dataclasses.fields(section_cls)}  # type: ignore[arg-type]
            extra = sorted(set(values) - known)
            if extra:
                raise ConfigError(f"unknown setting(s) in {name}: {', '.join(extra)} "
                                  f"(known: {', '.join(sorted(known))})")
            sections[name] = section_cls(**values)
        return cls(**sections)

    def replace(self, **sections: dict[str, Any]) -> Self:
        """A copy with some fields changed, e.g. ``replace(launch={"workers": 4})`` (validated again)."""
        data = self.to_dict()
        for name, values in sections.items():
            if name not in self.SECTIONS:
                raise ConfigError(f"unknown configuration section {name!r}")
            data[name].update(values)
        return type(self).from_dict(data)


@dataclass(frozen=True)
class ConfigField:
    """One leaf of a tree as the CLI sees it.

    Attributes:
        section: The section's name (``"session"``).
        name: The field's name (``"grad_accum"``).
        flag: The command-line flag (``"--grad-accum"``), or ``None`` for fields that are not flags.
        short: A one-letter alias, if any.
        type: The field's type with ``None`` removed (``int``, ``float``, ``str``, ``bool``, ``Path``).
        optional: Whether ``None`` is allowed.
        default: The default value.
        help: The documentation under the field.
        negatable: For a true/false flag: whether it has a ``--no-...`` form.
        argument: Whether the field is the command's positional argument.
    """

    section: str
    name: str
    flag: str | None
    short: str | None
    type: type
    optional: bool
    default: Any
    help: str
    negatable: bool = True
    argument: bool = False

    @property
    def path(self) -> str:
        """``section.name``."""
        return f"{self.section}.{self.name}"


def tree_fields(tree: type[Tree]) -> list[ConfigField]:
    """Every leaf of ``tree``, in declaration order."""
    out = []
    for section, cls in tree.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            optional = bool(typing.get_args(hint)) and type(None) in typing.get_args(hint)
            kind = args[0] if optional else hint
            default = f.default if f.default is not dataclasses.MISSING else None
            out.append(ConfigField(section, f.name, f.metadata.get("flag"), f.metadata.get("short"), kind,
                                   optional, default, docs.get(f.name, ""), f.metadata.get("negatable", True),
                                   f.metadata.get("argument", False)))
    return out


def kind_name(kind: type) -> str:
    """How an error message names a value type (``an integer``, ``a number``, ...)."""
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, kind.__name__)
