"""The longest functions and classes in the packages, and the host programs kept in string literals.

    python tools/room_sizes.py [--top N] [ROOT ...]

Prints one row per function over 80 lines or class over 300 lines (the limits docs/architecture.md
sets), then the N longest of each either way, then any module-level string constant whose name ends
in _SCRIPT, _PROBE or _LAUNCHER (how host programs used to be kept). Exit 1 when a limit is broken,
so `make lint` can hold the line.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

FUNCTION_LIMIT = 80
CLASS_LIMIT = 300
HOST_PROGRAM = re.compile(r"_(SCRIPT|PROBE|LAUNCHER)$")


def rooms(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]], list[str]]:
    functions, classes, programs = [], [], []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            where = f"{path}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((size, f"{where} def {node.name}"))
            elif isinstance(node, ast.ClassDef):
                classes.append((size, f"{where} class {node.name}"))
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.BinOp | ast.Call):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                programs += [f"{where} {name}" for name in names if HOST_PROGRAM.search(name)]
    return functions, classes, programs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", default=["thrust_remote", "trainer", "envcheck"])
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args(argv)
    functions, classes, programs = [], [], []
    for root in args.roots:
        f, c, p = rooms(Path(root))
        functions += f
        classes += c
        programs += p
    functions.sort(reverse=True)
    classes.sort(reverse=True)
    over = [r for r in functions if r[0] > FUNCTION_LIMIT] + [r for r in classes if r[0] > CLASS_LIMIT]
    print(f"over the limits (functions > {FUNCTION_LIMIT} lines, classes > {CLASS_LIMIT}): {len(over)}")
    for size, where in over:
        print(f"  {size:5d}  {where}")
    print(f"longest functions (of {len(functions)}):")
    for size, where in functions[:args.top]:
        print(f"  {size:5d}  {where}")
    print(f"longest classes (of {len(classes)}):")
    for size, where in classes[:args.top]:
        print(f"  {size:5d}  {where}")
    print(f"host programs in string literals: {len(programs)}")
    for where in programs:
        print(f"  {where}")
    return 1 if over or programs else 0


if __name__ == "__main__":
    sys.exit(main())
