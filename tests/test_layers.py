"""Imports point down the layer order written in docs/ARCHITECTURE.md, never up.

Every module under ``src/dtpo`` is read with :mod:`ast`; every ``dtpo`` import in it (module level or inside
a function, absolute or relative) is mapped to the layer of the package it names and compared with the
importing module's layer. The order comes from the fenced ``layers`` block of docs/ARCHITECTURE.md, so the
document and this test cannot disagree.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "dtpo"
DOC = REPO / "docs" / "ARCHITECTURE.md"
# The package's entry points: may import any layer.
FRONT_DOOR = {"dtpo/__init__.py", "dtpo/__main__.py", "dtpo/jax.py", "dtpo/keras.py", "dtpo/tensorflow.py"}

# Upward imports that other engineers are removing right now (empty when none): "file:line -> module".
KNOWN_UPWARD: set[str] = set()
# Import loops being untied right now (empty when none), each as its sorted module names.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def read_layers(text: str) -> dict[str, int]:
    """Layer rank of every top-level package, from the fenced ``layers`` block (top line = highest rank).

    Raises:
        ValueError: No such block, or a package named twice.
    """
    match = re.search(r"^```layers[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    if match is None:
        raise ValueError("no ```layers block")
    rows = [line.split("#", 1)[0].strip() for line in match.group(1).splitlines()]
    rows = [row for row in rows if row]
    ranks: dict[str, int] = {}
    for depth, row in enumerate(rows):
        for name in (part.strip().strip("/") for part in row.split(",")):
            if not name or name in ranks:
                raise ValueError(f"layer {name!r} is empty or named twice")
            ranks[name] = len(rows) - depth
    return ranks


@dataclass(frozen=True)
class Import:
    """One ``dtpo`` import: where it is and which module it names."""

    file: str
    line: int
    target: str


def module_name(path: Path, root: Path) -> str:
    """``dtpo.devices.simulated`` for ``root/dtpo/devices/simulated.py`` (packages without ``__init__``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def dtpo_imports(path: Path, root: Path) -> list[Import]:
    """Every import of a ``dtpo`` module in one file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    rel = str(path.relative_to(root))
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from dtpo import devices`` names the package dtpo.devices; ``from dtpo import Session`` dtpo.
            found += [Import(rel, node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return [imp for imp in found if imp.target == "dtpo" or imp.target.startswith("dtpo.")]


def layer_of(module: str, ranks: dict[str, int], root: Path) -> str | None:
    """The top-level package of a ``dtpo`` module name, if it is one (``None`` for the front door)."""
    parts = module.split(".")
    if len(parts) < 2 or not ((root / "dtpo" / parts[1]).is_dir() or parts[1] in ranks):
        return None
    return parts[1]


def upward_imports(root: Path, ranks: dict[str, int]) -> list[str]:
    """``file:line imports target (layer a -> higher layer b)`` for every import that points up.

    Imports of the front door (``dtpo`` itself) count as imports of the highest layer it imports.
    Modules in a package missing from the layer order are reported too.
    """
    problems: list[str] = []
    init = root / "dtpo" / "__init__.py"
    front_layers = [layer_of(imp.target, ranks, root) for imp in dtpo_imports(init, root)] if init.exists() else []
    front = max((ranks.get(layer or "", 0) for layer in front_layers), default=0)
    for path in sorted((root / "dtpo").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in FRONT_DOOR:
            continue
        here = layer_of(module_name(path, root), ranks, root)
        if here not in ranks:
            problems.append(f"{rel}: package {here!r} is not in the layer order of docs/ARCHITECTURE.md")
            continue
        for imp in dtpo_imports(path, root):
            there = layer_of(imp.target, ranks, root)
            rank = front if there is None else ranks.get(there)
            if rank is None:
                problems.append(f"{rel}:{imp.line}: imports {imp.target}, whose package {there!r} has no layer")
            elif rank > ranks[here]:
                problems.append(f"{rel}:{imp.line}: imports {imp.target} ({here} -> {there or 'dtpo'}, "
                                "which is higher in the layer order)")
            elif rank == ranks[here] and there is not None and there != here:
                problems.append(f"{rel}:{imp.line}: imports {imp.target} ({here} -> {there}, "
                                "a package on the same row of the layer order)")
    return problems


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the ``dtpo`` modules it imports (anywhere in the file, ``TYPE_CHECKING`` blocks included).

    An import of a name from a package counts as an import of that package's ``__init__``; a module's import of
    its own package's ``__init__`` is left out (the package initialises before its modules either way).
    """
    modules = {module_name(path, root): path for path in (root / "dtpo").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for imp in dtpo_imports(path, root):
            target = imp.target
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_module_imports_itself_round_a_loop() -> None:
    found = import_cycles(import_graph(PACKAGE.parent))
    cycles = [c for c in found if tuple(c) not in KNOWN_CYCLES]
    assert not KNOWN_CYCLES - {tuple(c) for c in found}, "untied: remove from KNOWN_CYCLES"
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_loop_through_three_modules_and_a_function_import(tmp_path: Path) -> None:
    files = {"dtpo/__init__.py": "", "dtpo/a/__init__.py": "", "dtpo/a/x.py": "from dtpo.a.y import f\n",
             "dtpo/a/y.py": "def f():\n    from dtpo.a import z\n", "dtpo/a/z.py": "import dtpo.a.x\n",
             "dtpo/a/w.py": "from dtpo.a.x import f\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert import_cycles(import_graph(tmp_path)) == [["dtpo.a.x", "dtpo.a.y", "dtpo.a.z"]]


def test_the_layer_order_is_written_down_in_the_architecture_doc() -> None:
    ranks = read_layers(DOC.read_text(encoding="utf-8"))
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(ranks), f"packages missing from the layer order: {sorted(packages - set(ranks))}"
    assert ranks["cli"] > ranks["workloads"] > ranks["session"] > ranks["tune"] > ranks["plan"]
    assert ranks["plan"] > ranks["distributed"] == ranks["telemetry"] > ranks["energy"]
    assert ranks["energy"] > ranks["devices"] > ranks["core"]


def test_imports_point_down() -> None:
    ranks = read_layers(DOC.read_text(encoding="utf-8"))
    problems = upward_imports(PACKAGE.parent, ranks)
    unexpected = [p for p in problems if p.split(" (")[0] not in KNOWN_UPWARD]
    assert not unexpected, "imports that point up the layers:\n" + "\n".join(unexpected)


def test_known_upward_imports_are_still_there() -> None:
    """An entry in the known list that no longer occurs must be taken out (so the list only shrinks)."""
    problems = {p.split(" (")[0] for p in upward_imports(PACKAGE.parent, read_layers(DOC.read_text("utf-8")))}
    assert not KNOWN_UPWARD - problems, f"fixed, remove from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - problems)}"


SYNTHETIC = {
    "dtpo/__init__.py": "from dtpo.high.api import thing\n",
    "dtpo/high/__init__.py": "",
    "dtpo/high/api.py": "from dtpo.low import base\n\nthing = 1\n",
    "dtpo/low/__init__.py": "",
    "dtpo/low/base.py": "import os\n\n\ndef late():\n    from ..high import api\n    return api\n",
    "dtpo/low/other.py": "import dtpo.high.api\nfrom . import base\n",
    "dtpo/low/front.py": "from dtpo import thing\n",
}


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    for rel, text in SYNTHETIC.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_checker_flags_upward_imports_in_functions_relative_and_absolute(synthetic: Path) -> None:
    problems = upward_imports(synthetic, {"high": 2, "low": 1})
    assert [p.split(" (")[0] for p in problems] == [
        "dtpo/low/base.py:5: imports dtpo.high.api",  # relative, inside a function
        "dtpo/low/front.py:1: imports dtpo.thing",  # the front door, which pulls in the highest layer
        "dtpo/low/other.py:1: imports dtpo.high.api",  # absolute, module level
    ]
    assert all("low -> high" in p or "low -> dtpo" in p for p in problems)
    # The other order: now high's import of low points up, and low's imports point down.
    assert [p.split(" (")[0] for p in upward_imports(synthetic, {"high": 1, "low": 2})] == [
        "dtpo/high/api.py:1: imports dtpo.low.base"]


def test_the_checker_flags_imports_between_packages_of_one_row(synthetic: Path) -> None:
    problems = upward_imports(synthetic, {"high": 1, "low": 1})
    assert "dtpo/high/api.py:1: imports dtpo.low.base" in [p.split(" (")[0] for p in problems]
    assert all("same row" in p for p in problems if "dtpo/high/api.py" in p)


def test_the_checker_flags_a_package_with_no_layer(synthetic: Path) -> None:
    problems = upward_imports(synthetic, {"low": 1})
    assert any("dtpo/high/api.py: package 'high' is not in the layer order" in p for p in problems)


def test_the_layer_block_is_parsed_top_down_with_shared_rows() -> None:
    text = "intro\n```layers\ncli\nplan      # comment\ndistributed, telemetry\ncore\n```\n"
    assert read_layers(text) == {"cli": 4, "plan": 3, "distributed": 2, "telemetry": 2, "core": 1}
    with pytest.raises(ValueError):
        read_layers("```text\ncli\n```\n")
    with pytest.raises(ValueError):
        read_layers("```layers\ncli\ncli\n```\n")
