"""The layout's rules: data flows server → planner → engine, the engine's layers import only those below
them, and the planner loads without the model stack."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = {"server": "server", "planner": "planner", "engine": "engine"}
ROOM_ORDER = ["engine", "planner", "server"]  # each may import those before it
ENGINE_LAYERS = ["errors", "kv", "kernels", "model", "runtime", "ai", "exec"]  # likewise, inside engine/


def _modules(room: str) -> list[tuple[str, Path]]:
    return [(str(path.relative_to(ROOT / room).with_suffix("")).replace("/", "."), path)
            for path in sorted((ROOT / room).rglob("*.py"))]


def _imports(path: Path) -> set[str]:
    """Every quail module a file imports, wherever in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quail."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("quail."))
    return found


def test_no_room_imports_a_room_above_it():
    wrong = []
    for level, room in enumerate(ROOM_ORDER):
        above = {f"quail.{r}" for r in ROOM_ORDER[level + 1:]} | {"quail.session", "quail.remote", "quail.cli"}
        for name, path in _modules(ROOMS[room]):
            wrong += [f"{room}/{name} imports {m}" for m in _imports(path) if any(
                m == a or m.startswith(a + ".") for a in above)]
    assert not wrong, wrong


def test_engine_layers_import_only_layers_below():
    wrong = []
    for name, path in _modules("engine"):
        layer = name.split(".")[0]
        if layer == "__init__":
            continue
        mine = ENGINE_LAYERS.index(layer)
        for module in _imports(path):
            if module.startswith("quail.engine."):
                theirs = module.removeprefix("quail.engine.").split(".")[0]
                if ENGINE_LAYERS.index(theirs) > mine:
                    wrong.append(f"engine/{name} ({layer}) imports {module} ({theirs})")
    assert not wrong, wrong


def test_engine_layers_are_the_engine_folders():
    folders = {p.name for p in (ROOT / "engine").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ENGINE_LAYERS) - {"errors"}
    assert {p.stem for p in (ROOT / "engine").glob("*.py")} == {"__init__", "errors"}


def test_planner_and_server_messages_load_without_torch():
    code = ("import sys, quail.planner.planner, quail.planner.substrait.consumer, quail.server.flight_messages; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _graph() -> dict[str, set[str]]:
    """Every module of the three rooms and the quail modules it imports, anywhere in the file (under
    TYPE_CHECKING and inside functions too); `from package import module` counts as importing the module."""
    names = {f"quail.{room}.{name}": path for room in ROOMS for name, path in _modules(room)}
    graph = {}
    for name, path in names.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quail."):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in names and m != name}
    return graph


def _loop_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` back to itself, if there is one."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop()
        for module in sorted(graph[path[-1]]):
            if module == start:
                return path + [start]
            if module not in seen:
                seen.add(module)
                paths.append(path + [module])
    return None


def test_no_module_imports_itself_through_others():
    """One-way ownership: no import loop, whether the imports run at load time, inside a function or only
    for type checking (the scheduler drives the model runner, which never sees it)."""
    graph = _graph()
    loops = {tuple(loop) for start in graph if (loop := _loop_from(graph, start))}
    assert not loops, sorted(loops)[:5]
