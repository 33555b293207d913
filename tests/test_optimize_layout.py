"""The shape of thrust_remote/optimize/ (docs/architecture.md, "Packages and what each may import"): the
study is told in one module, and the host, runs.* and run.* are reached from one module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "thrust_remote" / "optimize"


def modules() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*.py"))}


def test_only_the_scheduler_tells_the_study():
    callers = {name for name, tree in modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr == "tell"}
    assert callers == {"scheduler.py"}


# the host's run calls and a run's stages (thrust_remote/runs/control.py, thrust_remote/run/...)
DOORS = {"thrust_remote.runs.control", "thrust_remote.run.vocab", "thrust_remote.run.arguments",
         "thrust_remote.run.stages", "thrust_remote.run.following", "thrust_remote.run.fetching",
         "thrust_remote.run.sync", "thrust_remote.run.lifecycle"}


def test_only_hostops_imports_runs_and_pipeline():
    importers = set()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module in DOORS or {f"{node.module}.{a.name}" for a in node.names} & DOORS):
                importers.add(name)
    assert importers == {"hostops.py"}


def test_only_hostops_holds_shell_one_liners():
    holders = {name for name, tree in modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value in ("sh", "-c", "cat", "mkdir")}
    assert holders <= {"hostops.py"}


def test_size_rule():
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                assert lines <= (300 if isinstance(node, ast.ClassDef) else 80), f"{name}: {node.name} {lines}"
