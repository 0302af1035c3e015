"""The house limits, checked over the source tree (tests excluded): no source file over 300
lines, no function over 60, and no import circle between the project's modules.

Imports inside functions count too: a lazy import hides a circle from Python, not from a reader.
Run `python tools/house_check.py` from the repository root; it prints each breach and exits 1
when there is one.
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
SKIP = {".venv", "tests", "build", "ember.egg-info", "__pycache__"}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every project source file."""
    found = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if SKIP & set(rel.parts):
            continue
        name = ".".join(rel.with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(tree: ast.AST, mods: dict[str, Path]) -> set[str]:
    """The project modules a file imports (absolute imports; `from a import b` counts a.b when
    b is a module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in mods:
                    out.add(sub)
                elif node.module in mods:
                    out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in list(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def breaches(root: Path) -> list[str]:
    mods = modules(root)
    edges: dict[str, set[str]] = defaultdict(set)
    out = []
    for name, path in sorted(mods.items()):
        source = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        if (n := source.count("\n")) > MAX_FILE_LINES:
            out.append(f"file {rel}: {n} lines")
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"function {rel}:{node.lineno} {node.name}: {n} lines")
        edges[name] |= imports(tree, mods)
    out += [f"import circle: {' <-> '.join(c)}" for c in cycles(edges)]
    return out


def main() -> int:
    found = breaches(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print("\n".join(found) if found else "house limits kept")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
