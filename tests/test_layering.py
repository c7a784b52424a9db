"""The dependency rule: `sessions_app` (the domain) never imports `chat` (the gateway).

Also: imports sit at module top, except where app loading forces one into a function,
and then a comment on the line above says why; and no two modules import each other,
directly or around a loop, type-checking imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gatewayproject", "chat", "sessions_app")


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


@pytest.mark.parametrize("path", _modules("sessions_app"), ids=lambda p: str(p.relative_to(ROOT)))
def test_domain_never_imports_the_gateway(path: Path) -> None:
    tree = ast.parse(path.read_text())
    upward = [name for node in ast.walk(tree) for name in _imported(node) if name.split(".")[0] == "chat"]
    assert not upward, f"{path.relative_to(ROOT)} imports {upward}"


def _function_imports(tree: ast.Module) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [n for n in ast.walk(func) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


@pytest.mark.parametrize("path", [p for pkg in PACKAGES for p in _modules(pkg)], ids=lambda p: str(p.relative_to(ROOT)))
def test_function_local_imports_say_why(path: Path) -> None:
    source = path.read_text()
    lines = source.splitlines()
    unexplained = []
    for node in _function_imports(ast.parse(source)):
        if "#" in lines[node.lineno - 1]:
            continue
        above = node.lineno - 2  # the reason may stand above a group of imports
        while above >= 0 and (not lines[above].strip() or lines[above].strip().startswith(("from ", "import "))):
            above -= 1
        if above < 0 or "#" not in lines[above]:
            unexplained.append(node.lineno)
    assert not unexplained, f"{path.relative_to(ROOT)}: function-local imports without a reason at {unexplained}"


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    tree = ast.parse("def f():\n    from chat import wire\n")
    assert [n for node in ast.walk(tree) for n in _imported(node)] == ["chat"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file, `from x import module` too)."""
    paths = {_module_name(p): p for pkg in PACKAGES for p in _modules(pkg)}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = _imported(node)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets += [f"{node.module}.{alias.name}" for alias in node.names]
            graph[name] |= {t for t in targets if t in paths and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    graph = _import_graph()
    # a package's __init__ that hands on its modules is not a circle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert _cycles(graph) == []


def test_the_circle_rule_catches_a_type_only_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
