"""The agent's ``sitecustomize`` reads the launch contract's flag without importing dtpo."""

from __future__ import annotations

import ast

from dtpo.agent import BOOT_DIR
from dtpo.core.launch_contract import AGENT_ENV


def test_the_boot_file_names_the_contracts_agent_flag() -> None:
    tree = ast.parse((BOOT_DIR / "sitecustomize.py").read_text())
    values = [node.value.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "AGENT_ENV" for t in node.targets)
              and isinstance(node.value, ast.Constant)]
    assert values == [AGENT_ENV]
