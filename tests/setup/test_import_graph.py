"""The package's import structure: no import cycle, no private name across packages.

Every ``import`` statement of every module is read with ``ast`` (module level and inside
functions alike, since a deferred import is still a dependency), so the graph is the one the
code states, not only what happens to be imported at start-up.

An edge goes from a module to what it names: ``from pkg import sub`` to the submodule ``sub``,
``from pkg import name`` (not a submodule) to ``pkg`` itself, that is its ``__init__``. The
import of a package's ``__init__`` that Python makes before any of its submodules is not an
edge, or every package that imports its own submodules would be a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_companion"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` of each import in ``path`` (``name`` None for ``import module``)."""
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The absolute module of ``from ... import``, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = (here if is_package else here.rpartition(".")[0]).split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports_of(source: str, here: str, is_package: bool) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, here, is_package)
            found += [(module, alias.name) for alias in node.names]
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (see the module docstring for the edges)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for module, imported in _imports(path):
            if imported is not None and f"{module}.{imported}" in modules:
                edges.add(f"{module}.{imported}")
            elif module in modules:
                edges.add(module)
        graph[name] = edges - {name}
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


def _write_package(root: Path, files: dict[str, str]) -> Path:
    """A fake ``grpo_companion`` under ``root`` with the given module sources."""
    for relative, source in files.items():
        path = root / "grpo_companion" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if parent != Path(".") and not (root / parent / "__init__.py").exists():
                (root / parent / "__init__.py").write_text("")
        path.write_text(source)
    return root / "grpo_companion"


def test_the_graph_is_read_from_the_code():
    graph = _import_graph(_modules())
    assert len([m for m in graph if m.startswith("grpo_companion.theory.")]) >= 20
    assert {"grpo_companion.rl", "grpo_companion.book", "grpo_companion.practice",
            "grpo_companion.symbolic", "grpo_companion.validation"} <= set(graph)
    # a known edge of each kind: module level, relative, deferred inside a function, and a
    # name imported from a package (an edge to its __init__)
    assert "grpo_companion.theory._group_kernels" in graph["grpo_companion.theory.calibration"]
    assert "grpo_companion.theory.calibration" in graph["grpo_companion.theory.finite_group"]
    assert "grpo_companion.book.links" in graph["grpo_companion.book.pipeline"]
    assert "grpo_companion.theory" in graph["grpo_companion.rl.long_run"]
    # a package importing its own submodules is not a cycle with them
    assert "grpo_companion.theory" not in graph["grpo_companion.theory.dynamics"]


def test_the_package_has_no_import_cycle():
    assert find_cycle(_import_graph(_modules())) is None


def test_the_cycle_check_finds_a_cycle():
    """The check fails on the layout this test replaced (calibration <-> finite_group)."""
    graph = _import_graph(_modules())
    theory = {m for m in graph if m.startswith("grpo_companion.theory.")}
    graph = {m: graph[m] & theory for m in theory}
    assert find_cycle(graph) is None
    graph["grpo_companion.theory.calibration"].add("grpo_companion.theory.finite_group")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"grpo_companion.theory.calibration", "grpo_companion.theory.finite_group"} <= set(
        cycle)


def test_a_deferred_import_across_packages_is_a_cycle(tmp_path, monkeypatch):
    """A cycle closed by an import inside a function, across two subpackages (as
    book.pipeline -> book.export -> book.pipeline was, and theory.calibration ->
    theory.finite_group -> theory.calibration before it)."""
    fake = _write_package(tmp_path, {
        "book/pipeline.py": "from grpo_companion.rl.io import write\n",
        "rl/io.py": "def write():\n    from ..book import pipeline\n",
    })
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert find_cycle(_import_graph(_modules())) == [
        "grpo_companion.book.pipeline", "grpo_companion.rl.io", "grpo_companion.book.pipeline"]


def _owner(module: str) -> str:
    """The subpackage (or top-level module) of ``grpo_companion`` that ``module`` is in."""
    return ".".join(module.split(".")[:2])


def _private_uses_across_packages() -> list[str]:
    """``module: imported`` where a module imports a private module or name of another
    subpackage, or reads a private attribute (``x._name``) of a module or object it imported
    from one."""
    found = []
    modules = _modules()
    for name, path in modules.items():
        bound: dict[str, str] = {}  # local name -> what it is, in another package
        tree = _parse(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, None, alias.asname or alias.name.split(".")[0],
                          alias.name if alias.asname else alias.name.split(".")[0])
                         for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(node, name, path.name == "__init__.py")
                pairs = [(module, alias.name, alias.asname or alias.name,
                          f"{module}.{alias.name}") for alias in node.names]
            else:
                continue
            for module, imported, local, target in pairs:
                parts = module.split(".")
                if parts[0] != "grpo_companion":
                    continue
                owner = _owner(target if target in modules else module)
                if owner != _owner(name) or target == "grpo_companion":
                    bound[local] = target
                if owner == _owner(name):
                    continue
                private_module = any(p.startswith("_") and p != "__init__" for p in parts[1:])
                private_name = imported is not None and imported.startswith("_")
                if private_module or private_name:
                    found.append(f"{name}: {module}{'.' + imported if imported else ''}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                target = ".".join([bound[value.id], *chain])
                if _owner(target) != _owner(name) or target.count(".") == 1:
                    found.append(f"{name}: {target}")
    return found


def test_no_private_import_across_packages():
    assert _private_uses_across_packages() == []


def test_the_private_import_check_finds_one(tmp_path, monkeypatch):
    """The check reports the imports this test replaced (rl.trainer ->
    theory._validate.memory_limit_bytes, book.explorer -> theory._validate)."""
    fake = _write_package(tmp_path, {
        "rl/trainer.py": "def f():\n    from grpo_companion.theory._validate import "
                         "memory_limit_bytes\n",
        "book/explorer.py": "from ..theory._validate import check_count\n",
        "theory/_validate.py": "",
    })
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert sorted(_private_uses_across_packages()) == [
        "grpo_companion.book.explorer: grpo_companion.theory._validate.check_count",
        "grpo_companion.rl.trainer: grpo_companion.theory._validate.memory_limit_bytes"]


def test_the_private_attribute_check_finds_one(tmp_path, monkeypatch):
    """``x._name`` on a module or object of another package is reported; on one's own package's
    objects, or on objects from outside grpo_companion, it is not."""
    fake = _write_package(tmp_path, {
        "rl/long_run.py": (
            "import numpy as np\n"
            "from grpo_companion import theory\n"
            "from grpo_companion.theory import finite_group as fg\n"
            "from grpo_companion.theory.calibration import Calibration\n"
            "from grpo_companion.rl.trainer import PreparedRun\n"
            "import grpo_companion.practice.trl_bridge\n"
            "def f(prep):\n"
            "    theory._validate.check_count\n"
            "    fg._table(1)\n"
            "    Calibration._logit_table\n"
            "    PreparedRun._loop\n"
            "    grpo_companion.practice.trl_bridge._theory\n"
            "    np._core\n"
            "    prep._run\n"),
        "rl/trainer.py": "class PreparedRun:\n    pass\n",
        "theory/finite_group.py": "", "theory/calibration.py": "",
        "practice/trl_bridge.py": "",
    })
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert sorted(_private_uses_across_packages()) == [
        "grpo_companion.rl.long_run: grpo_companion.practice.trl_bridge._theory",
        "grpo_companion.rl.long_run: grpo_companion.theory._validate",
        "grpo_companion.rl.long_run: grpo_companion.theory.calibration.Calibration._logit_table",
        "grpo_companion.rl.long_run: grpo_companion.theory.finite_group._table",
    ]


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
