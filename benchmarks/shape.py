"""The package's shape, the figures the floor issue tracks: files over 400 lines, functions over 60
lines, functions with 9 or more parameters outside click commands (a click command takes one parameter
per option). Not a timing: an AST count of the source, the same on every machine.

    python benchmarks/shape.py [PACKAGE_DIR ...]      # default: this tree's huggy_convert/

With several folders (another checkout's package beside this one) each gets its own line.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE, MAX_FUNCTION, MAX_PARAMETERS = 400, 60, 8


def _parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def _click_command(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ("command", "option")
               for d in fn.decorator_list)


def shape(package: Path) -> dict:
    files, functions, parameters = [], [], []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(package.parent).as_posix()
        if len(text.splitlines()) > MAX_FILE:
            files.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION:
                functions.append((lines, f"{rel}:{node.name}"))
            if _parameters(node) > MAX_PARAMETERS and not _click_command(node):
                parameters.append((_parameters(node), f"{rel}:{node.name}"))
    return {"files": sorted(files, reverse=True), "functions": sorted(functions, reverse=True),
            "parameters": sorted(parameters, reverse=True)}


def main() -> int:
    for package in [Path(p) for p in sys.argv[1:]] or [ROOT / "huggy_convert"]:
        s = shape(package)
        print(f"{package}: {len(s['files'])} files over {MAX_FILE} lines, {len(s['functions'])} functions over "
              f"{MAX_FUNCTION} lines, {len(s['parameters'])} functions with {MAX_PARAMETERS + 1}+ parameters "
              "(click commands aside)")
        for key in ("files", "functions", "parameters"):
            print(f"  {key}: " + ", ".join(f"{name} ({n})" for n, name in s[key][:5]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
