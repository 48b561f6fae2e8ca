"""The project's tidy (as rustc's src/tools/tidy checks structure): the import rule of
doctor/__init__.py, the package list in pyproject.toml, workers that import nothing of ours,
a light plugin entry, no import circles, and no overgrown functions."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "mgft_doctor"
# subsystem -> the subsystems it may import (besides itself and the leaves)
LEAVES = {"errors", "text", "terminal"}
ALLOWED = {
    "catalog": set(),
    "explain": {"catalog"},
    "runconfig": set(),
    "launch": set(),
    "check": {"launch", "explain", "runconfig", "catalog"},
    "probes": {"check", "launch", "runconfig", "catalog", "explain"},
    "cli": {"check", "launch", "explain", "runconfig", "catalog", "probes", "watch"},
    "pytest_plugin": {"check", "explain", "launch", "catalog", "runconfig"},
    "watch": {"launch", "explain", "catalog"},
}
MAX_LONG_FUNCTIONS = 2  # functions over 100 lines in the whole package


def source_files():
    for path in sorted((ROOT / "doctor").rglob("*.py")):
        yield path, _module(path, ROOT / "doctor", [PKG])
    for path in sorted((ROOT / "probes").rglob("*.py")):
        yield path, _module(path, ROOT / "probes", [PKG, "probes"])


def _module(path: Path, base: Path, prefix: list[str]) -> list[str]:
    parts = list(path.relative_to(base).with_suffix("").parts)
    return prefix + (parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(path: Path, module: list[str]) -> list[tuple[list[str], int]]:
    """Every mgft_doctor module this file imports (resolved), with the line, lazy imports included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if _is_package(path) else module[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name.split("."), node.lineno) for a in node.names if a.name.split(".")[0] == PKG]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == PKG:
                target = node.module.split(".")
            else:
                continue
            names = [a.name for a in node.names]
            out.append((target, node.lineno))
            out += [(target + [n], node.lineno) for n in names if _exists(target + [n])]
    return out


def _exists(module: list[str]) -> bool:
    rel = module[1:]
    if rel[:1] == ["probes"]:
        base, rel = ROOT / "probes", rel[1:]
    else:
        base = ROOT / "doctor"
    p = base.joinpath(*rel)
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def subsystem(module: list[str]) -> str:
    return module[1] if len(module) > 1 else ""


def test_imports_go_one_way():
    bad = []
    for path, module in source_files():
        me = subsystem(module)
        for target, line in imports(path, module):
            them = subsystem(target)
            if them in ("", me) or them in LEAVES:
                if me in LEAVES and them not in ("", me) and them in LEAVES and them != me:
                    bad.append(f"{path.relative_to(ROOT)}:{line} leaf {me} imports {'.'.join(target)}")
                continue
            if me in LEAVES:
                bad.append(f"{path.relative_to(ROOT)}:{line} leaf {me} imports {'.'.join(target)}")
            elif me == "__main__":
                continue
            elif them not in ALLOWED.get(me, set()):
                bad.append(f"{path.relative_to(ROOT)}:{line} {me} -> {'.'.join(target)}")
    assert not bad, "imports against the rule in doctor/__init__.py:\n" + "\n".join(bad)


def test_no_probe_imports_another_probe():
    bad = []
    for path, module in source_files():
        if module[:2] != [PKG, "probes"] or module[:3] == [PKG, "probes", "workers"] or len(module) != 3:
            continue
        for target, line in imports(path, module):
            if (target[:2] == [PKG, "probes"] and len(target) >= 3 and target[2] != "_codes"
                    and target[2] != "workers" and target != module):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {'.'.join(target)}")
    assert not bad, "\n".join(bad)


def test_workers_import_nothing_of_the_package():
    bad = []
    for path in sorted((ROOT / "probes" / "workers").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.ImportFrom) and node.level:
                bad.append(f"{path.name}:{node.lineno} relative import")
            bad += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == PKG]
    assert not bad, "workers run in the examined Python and may not import mgft_doctor:\n" + "\n".join(bad)


def test_plugin_entry_imports_only_pytest_and_its_state():
    path = ROOT / "doctor" / "pytest_plugin" / "__init__.py"
    top = ast.parse(path.read_text(encoding="utf-8")).body
    found = []
    for node in top:
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
    assert set(found) <= {"__future__", "pytest", ".state"}, found
    state = ROOT / "doctor" / "pytest_plugin" / "state.py"
    top = ast.parse(state.read_text(encoding="utf-8")).body
    mods = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    mods |= {("." * n.level) + (n.module or "") for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(m.startswith(".") or m.startswith(PKG) for m in mods), mods  # a leaf: stdlib and pytest


def test_no_import_circles_between_modules():
    graph: dict[str, set[str]] = {}
    for path, module in source_files():
        me = ".".join(module)
        top = ast.parse(path.read_text(encoding="utf-8")).body  # module-level imports only: lazy ones cannot loop
        sub = ast.Module(body=[n for n in top if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
        tmp = path.parent / f".layout-{path.name}"
        try:
            tmp.write_text(ast.unparse(sub), encoding="utf-8")
            deps = {".".join(t) for t, _ in imports(tmp, module)}
        finally:
            tmp.unlink()
        graph[me] = {d for d in deps if d != me and not me.startswith(d + ".")}
    seen, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in graph.get(node, ()):
            visit(nxt)
        stack.pop()

    for node in sorted(graph):
        visit(node)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_every_package_is_listed_in_pyproject():
    """An editable install hides a missing package; a wheel would ship without it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    present = {".".join(m) for p, m in source_files() if _is_package(p)} | {f"{PKG}.known_errors"}
    assert present == listed, (sorted(present - listed), sorted(listed - present))


def test_root_holds_at_most_five_loose_modules():
    loose = sorted(p.name for p in (ROOT / "doctor").glob("*.py"))
    assert len(loose) <= 5, loose


def test_at_most_two_functions_over_100_lines():
    long = []
    for path, _ in source_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert len(long) <= MAX_LONG_FUNCTIONS, "\n".join(long)
