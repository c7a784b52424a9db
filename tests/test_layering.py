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


def _modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "migrations" not in p.parts)


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def _gateway_imports(source: str) -> list[str]:
    """The rule's check: what in `chat` this domain module imports, anywhere in it."""
    return [name for node in ast.walk(ast.parse(source)) for name in _imported(node) if name.split(".")[0] == "chat"]


@pytest.mark.parametrize("path", _modules("sessions_app"), ids=lambda p: str(p.relative_to(ROOT)))
def test_domain_never_imports_the_gateway(path: Path) -> None:
    upward = _gateway_imports(path.read_text())
    assert not upward, f"{path.relative_to(ROOT)} imports {upward}"


def test_the_rule_catches_an_upward_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "import chatty\n"  # a name that only starts like the gateway's
        "from sessions_app import models\n"
        "import chat.websocket.consumer as consumer\n"
        "if TYPE_CHECKING:\n"
        "    from chat.protocol.wire import AckStatus\n"
        "def f():\n"
        "    from chat import runtime\n"
    )
    assert _gateway_imports(source) == ["chat.websocket.consumer", "chat.protocol.wire", "chat"]
    assert _gateway_imports("import chatty\nfrom sessions_app import models\n") == []


def _function_imports(tree: ast.Module) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [n for n in ast.walk(func) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def _unexplained_function_imports(source: str) -> list[int]:
    """The rule's check: lines of function-local imports with no comment on them or above their group."""
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
    return unexplained


@pytest.mark.parametrize("path", [p for pkg in PACKAGES for p in _modules(pkg)], ids=lambda p: str(p.relative_to(ROOT)))
def test_function_local_imports_say_why(path: Path) -> None:
    unexplained = _unexplained_function_imports(path.read_text())
    assert not unexplained, f"{path.relative_to(ROOT)}: function-local imports without a reason at {unexplained}"


def test_the_local_import_rule_catches_an_unexplained_one() -> None:
    source = (
        "import os\n"  # 1: at module top, needs nothing
        "def explained_above():\n"
        "    # the app registry is not ready at import time\n"
        "    from django.contrib.auth import get_user_model\n"  # 4
        "    import json\n"  # 5: in the group under the same comment
        "def explained_on_the_line():\n"
        "    import json  # cycle with the models\n"  # 7
        "def unexplained():\n"
        "    x = 1\n"
        "    import json\n"  # 10
        "async def unexplained_async():\n"
        "    from os import path\n"  # 12
        "class C:\n"
        "    def method(self):\n"
        "        import json\n"  # 15
    )
    assert _unexplained_function_imports(source) == [10, 12, 15]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file, `from x import module` too)."""
    paths = {_module_name(p, root): p for pkg in packages for p in _modules(pkg, root)}
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


def _import_circles(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    """The rule's check: groups of modules that import each other, directly or around a loop."""
    graph = _import_graph(root, packages)
    # a package's __init__ that hands on its modules is not a circle with them
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return _cycles(graph)


def test_no_import_circles() -> None:
    assert _import_circles() == []


def test_the_circle_rule_catches_a_type_only_loop(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg import a, d\n",  # hands on its modules: not a circle
        "pkg/a.py": "from pkg import b\n",  # `from package import module` counts
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import Thing\n",
        "pkg/c.py": "def f():\n    import pkg.a  # late, still a circle\n",
        "pkg/d.py": "import pkg.a\n",  # imports into the loop, is not part of it
        "pkg/migrations/m.py": "import pkg.d\n",
        "other/__init__.py": "",
        "other/x.py": "from other import y\n",
        "other/y.py": "from other.x import z\n",  # a direct pair
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _import_circles(tmp_path, ("pkg", "other")) == [["pkg.a", "pkg.b", "pkg.c"], ["other.x", "other.y"]]
    (tmp_path / "pkg/c.py").write_text("")
    assert _import_circles(tmp_path, ("pkg",)) == []


def _orm_queries(source: str) -> list[int]:
    """Lines that query through a model manager (`X.objects`): reads belong in sessions_app's read modules."""
    tree = ast.parse(source)
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "objects")


@pytest.mark.parametrize("path", _modules("chat"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_gateway_reads_through_the_domain(path: Path) -> None:
    """chat/ asks `sessions_app.gateway_reads` (or `statements`) instead of querying models itself."""
    assert not _orm_queries(path.read_text()), (
        f"{path.relative_to(ROOT)} queries the ORM at {_orm_queries(path.read_text())}"
    )


def test_the_orm_rule_catches_a_query() -> None:
    source = "from sessions_app.models import Run\n\n\ndef f():\n    return Run.objects.filter(pk=1)\n"
    assert _orm_queries(source) == [5]
    assert _orm_queries("objects = 1\nx = objects\n") == []


def _room(module: str) -> str:
    """A module's room: the first-level package of `chat` it sits in (or the module itself); outside
    `chat`, the module (the project's settings, asgi and logs are not one room)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "chat" and len(parts) > 1 else module


def _room_circles(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[list[str]]:
    """Rooms that import each other, directly or around a loop, type-checking and late imports included."""
    rooms: dict[str, set[str]] = {}
    for name, targets in _import_graph(root, packages).items():
        room = rooms.setdefault(_room(name), set())
        for target in targets:
            if not name.startswith(target + "."):  # a package's __init__ handing on its modules
                rooms.setdefault(_room(target), set())
                if _room(target) != _room(name):
                    room.add(_room(target))
    return _cycles(rooms)


def test_no_circles_between_the_rooms_of_the_gateway() -> None:
    assert _room_circles() == []


def test_the_room_rule_catches_a_loop_through_two_rooms(tmp_path: Path) -> None:
    files = {
        "chat/__init__.py": "",
        "chat/low/__init__.py": "",
        "chat/low/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from chat.high.b import B\n",
        "chat/high/__init__.py": "",
        "chat/high/b.py": "from chat.low import a\n",  # a module circle too, but through two rooms
        "chat/high/c.py": "from chat.low import a\n",
        "chat/top.py": "from chat.high import c\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _room_circles(tmp_path, ("chat",)) == [["chat.high", "chat.low"]]
    (tmp_path / "chat/low/a.py").write_text("")
    assert _room_circles(tmp_path, ("chat",)) == []


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100


@pytest.mark.parametrize(
    "path",
    [p for pkg in ("chat", "sessions_app") for p in _modules(pkg)] + sorted((ROOT / "static" / "chat").glob("*.js")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_rooms_stay_small(path: Path) -> None:
    """No module (or page script) over 600 lines, no Python function over 100: catch-alls get split."""
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, (
        f"{path.relative_to(ROOT)} has {len(source.splitlines())} lines"
    )
    if path.suffix == ".py":
        long = [
            f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
        ]
        assert not long, f"{path.relative_to(ROOT)}: {long}"
