"""The package's import structure: no cycle inside ``theory``, no private name across packages.

Every ``import`` statement of every module is read with ``ast`` (module level and inside
functions alike, since a deferred import is still a dependency), so the graph is the one the
code states, not only what happens to be imported at start-up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_companion"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` of each import in ``path`` (``name`` None for ``import module``)."""
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _imports_of(source: str, here: str, is_package: bool) -> list[tuple[str, str | None]]:
    package = here if is_package else here.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found += [(module, alias.name) for alias in node.names]
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _theory_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith("grpo_companion.theory."):
            continue
        edges = set()
        for module, imported in _imports(path):
            # `from . import x` names a submodule; `from .x import y` the module x
            candidates = [f"{module}.{imported}", module] if imported else [module]
            edges |= {c for c in candidates if c in modules and c.startswith(
                "grpo_companion.theory.") and c != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_is_read_from_the_code():
    graph = _theory_graph(_modules())
    assert len(graph) >= 20  # every theory module
    # a known edge of each kind: module level, relative, and the chapter modules on the core
    assert "grpo_companion.theory._group_kernels" in graph["grpo_companion.theory.calibration"]
    assert "grpo_companion.theory.calibration" in graph["grpo_companion.theory.finite_group"]


def test_theory_has_no_import_cycle():
    assert find_cycle(_theory_graph(_modules())) is None


def test_the_cycle_check_finds_a_cycle():
    """The check fails on the layout this test replaced (calibration <-> finite_group)."""
    graph = _theory_graph(_modules())
    graph["grpo_companion.theory.calibration"].add("grpo_companion.theory.finite_group")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"grpo_companion.theory.calibration", "grpo_companion.theory.finite_group"} <= set(
        cycle)


def _private_imports_across_packages() -> list[str]:
    """``module: imported`` where a module imports a private name of another subpackage."""
    found = []
    for name, path in _modules().items():
        own = name.split(".")[:2]
        for module, imported in _imports(path):
            parts = module.split(".")
            if parts[0] != "grpo_companion" or parts[:2] == own:
                continue
            private_module = any(p.startswith("_") and p != "__init__" for p in parts[1:])
            private_name = imported is not None and imported.startswith("_")
            if private_module or private_name:
                found.append(f"{name}: {module}{'.' + imported if imported else ''}")
    return found


def test_no_private_import_across_packages():
    assert _private_imports_across_packages() == []


def test_the_private_import_check_finds_one(tmp_path, monkeypatch):
    """The check reports the import this test replaced (rl.trainer -> theory._validate)."""
    fake = tmp_path / "grpo_companion"
    (fake / "rl").mkdir(parents=True)
    (fake / "theory").mkdir()
    (fake / "rl" / "trainer.py").write_text(
        "def f():\n    from grpo_companion.theory._validate import memory_limit_bytes\n")
    (fake / "theory" / "_validate.py").write_text("")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert _private_imports_across_packages() == [
        "grpo_companion.rl.trainer: grpo_companion.theory._validate.memory_limit_bytes"]


@pytest.mark.parametrize("source, here, expected", [
    ("from . import roots", "grpo_companion.theory.dynamics", ("grpo_companion.theory", "roots")),
    ("from .calibration import Calibration", "grpo_companion.theory.dynamics",
     ("grpo_companion.theory.calibration", "Calibration")),
    ("from ..host import memory_limit_bytes", "grpo_companion.theory._validate",
     ("grpo_companion.host", "memory_limit_bytes")),
    ("import grpo_companion.rl.losses", "grpo_companion.book.claims",
     ("grpo_companion.rl.losses", None)),
])
def test_imports_resolve(source, here, expected):
    assert _imports_of(source, here, is_package=False) == [expected]
