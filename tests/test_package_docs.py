"""Package docstrings name only what exists: every cross-reference resolves, every file they mention is there.

A package's docstring is what a newcomer reads first (``help(dtpo.tune)``); one that names a module that moved
away or a class that was renamed describes an earlier state. Sphinx roles (``:class:`~dtpo.x.Y```), dotted
``dtpo.`` names in double backquotes and ``something.py`` file names are checked.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dtpo"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "data" not in p.relative_to(PACKAGE).parts)
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):`~?([\w.]+)`")
DOTTED = re.compile(r"``(dtpo(?:\.\w+)+)``")
FILE = re.compile(r"``?([\w/]+\.py)``?")


def docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def resolves(name: str, package: str) -> bool:
    """Whether ``name`` (absolute, or relative to ``package``) is a module or an attribute of one."""
    candidates = [name] if name.startswith("dtpo") else [f"{package}.{name}", name]
    for candidate in candidates:
        parts = candidate.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return True
    return False


def missing_names(package: Path, root: Path = PACKAGE.parent) -> list[str]:
    """What the package's docstring names that does not exist (``root`` holds the ``dtpo`` folder)."""
    text = docstring(package)
    dotted = ".".join(package.relative_to(root).parts)
    missing = [name for name in ROLE.findall(text) + DOTTED.findall(text) if not resolves(name, dotted)]
    files = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    missing += [f for f in FILE.findall(text) if f not in files and not any(x.endswith("/" + f) for x in files)]
    return missing


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_package_docstring_names_only_what_exists(package: Path) -> None:
    assert docstring(package), f"{package.name}/__init__.py has no docstring"
    assert missing_names(package) == []


def test_the_checker_flags_a_missing_module_class_and_file(tmp_path: Path) -> None:
    pkg = tmp_path / "dtpo" / "fake"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Uses :class:`~dtpo.core.errors.ConfigError`, '
                                     ':class:`~dtpo.core.errors.Gone`,\n``dtpo.no_such_package`` and ``here.py``, '
                                     '``gone.py``."""\n')
    (pkg / "here.py").write_text("")
    assert sorted(missing_names(pkg, tmp_path)) == ["dtpo.core.errors.Gone", "dtpo.no_such_package", "gone.py"]
