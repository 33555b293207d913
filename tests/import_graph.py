"""The package's import graph as its source says it (ast, imports inside functions included: they hide a
circle from Python's start-up, not from this graph), and one walk that finds a circle in it. Read by
tests/test_layering.py (no circle among the agent's modules, nor between backends/ and run/) and
tests/test_agent_scheduled.py (none through the scheduler table's modules, imported by name)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "thrust_remote" / "agent"


def agent_imports() -> dict[str, set[str]]:
    """thrust_remote/agent's modules -> the agent modules each imports, at its top or inside a function
    (`from . import x`, `from .x import y`, `from thrust_remote.agent.x import y`)."""
    own = {p.stem for p in AGENT.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(AGENT.glob("*.py")):
        reached: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                reached |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("thrust_remote.agent"):
                rest = (node.module or "").split(".")[2:]
                reached |= {rest[0]} if rest else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                reached |= {a.name.split(".")[2] for a in node.names if a.name.startswith("thrust_remote.agent.")}
        graph[path.stem] = (reached & own) - {path.stem}
    return graph


def module_imports(module: str) -> set[str]:
    """The thrust_remote modules `module` (dotted) imports, at its top or inside a function."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module.replace(".", "/") / "__init__.py"
    reached: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("thrust_remote"):
            for a in node.names:  # `from thrust_remote.run import stages` reaches the module run.stages
                full = f"{node.module}.{a.name}"
                reached.add(full if (ROOT / (full.replace(".", "/") + ".py")).exists() else str(node.module))
        elif isinstance(node, ast.Import):
            reached |= {a.name for a in node.names if a.name.startswith("thrust_remote")}
    return reached


def import_circle(starts: Iterable[str], imports_of: Callable[[str], Iterable[str]]) -> list[str] | None:
    """The first circle reached from `starts` along `imports_of` (a module -> the modules it imports that
    the walk follows), as the modules that close it (`a -> b -> a`); None: there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return None
        for reached in sorted(imports_of(module)):
            circle = visit(reached, [*path, module])
            if circle is not None:
                return circle
        done.add(module)
        return None

    for module in starts:
        found = visit(module, [])
        if found is not None:
            return found
    return None
