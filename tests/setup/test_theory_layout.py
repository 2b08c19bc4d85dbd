"""The layout of ``grpo_companion.theory``: core modules at the top, chapter analyses below.

``theory/`` holds the core (what the trainer and every chapter use) and the subpackage
``theory/analyses/`` holds modules that each serve one chapter. The rules checked here, on the
source (``ast``, so deferred imports inside functions count too):

- no top-level theory module imports ``grpo_companion.theory.analyses`` (core never depends
  on a chapter's analysis);
- every top-level module is named in the core list of ``theory/__init__``'s docstring, and
  every module of ``analyses/`` in the docstring of ``analyses/__init__``, so that those two
  docstrings stay the map of the folders.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

THEORY = Path(__file__).resolve().parents[2] / "grpo_companion" / "theory"
ANALYSES = "grpo_companion.theory.analyses"


def _modules(folder: Path) -> list[str]:
    """The module names of ``folder`` (``__init__`` left out)."""
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")


def _listed(init: Path) -> set[str]:
    """Module names in the ``- ``name``:`` bullets of a package docstring."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    return set(re.findall(r"^- ``(\w+)``", doc, flags=re.M))


def _imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of what ``path`` (a module of ``package``) imports, relative imports
    resolved; ``from x import y`` gives ``x.y`` (``y`` may be a submodule or a name in ``x``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def core_imports_of_analyses(theory: Path = THEORY) -> list[str]:
    """``module: imported`` for each top-level theory module that imports the analyses."""
    found = []
    for name in [*_modules(theory), "__init__"]:
        for imported in sorted(_imported_modules(theory / f"{name}.py",
                                                 "grpo_companion.theory")):
            if imported == ANALYSES or imported.startswith(ANALYSES + "."):
                found.append(f"{name}: {imported}")
    return found


def unlisted_modules(theory: Path = THEORY) -> dict[str, list[str]]:
    """Modules missing from their package's docstring: ``{"core": [...], "analyses": [...]}``."""
    analyses = theory / "analyses"
    return {
        "core": sorted(set(_modules(theory)) - _listed(theory / "__init__.py")),
        "analyses": sorted(set(_modules(analyses)) - _listed(analyses / "__init__.py")),
    }


def test_the_layout_has_both_levels():
    assert {"calibration", "dynamics", "roots", "kl_estimators"} <= set(_modules(THEORY))
    assert {"table1", "bifurcation", "clipped", "trained_loss"} <= set(
        _modules(THEORY / "analyses"))


def test_no_core_module_imports_the_analyses():
    assert core_imports_of_analyses() == []


def test_every_module_is_listed_in_its_package_docstring():
    assert unlisted_modules() == {"core": [], "analyses": []}


@pytest.mark.parametrize("source", [
    "from .analyses import table1\n",
    "from grpo_companion.theory.analyses.staged import staged_iterate\n",
    "def f():\n    from .analyses import clipped\n",
    "import grpo_companion.theory.analyses.entropy\n",
])
def test_the_import_check_finds_one(tmp_path, source):
    (tmp_path / "analyses").mkdir()
    (tmp_path / "__init__.py").write_text('"""Core.\n\n- ``dynamics``: x.\n"""\n')
    (tmp_path / "analyses" / "__init__.py").write_text('"""Analyses."""\n')
    (tmp_path / "dynamics.py").write_text(source)
    assert len(core_imports_of_analyses(tmp_path)) == 1


def test_the_docstring_check_finds_an_unlisted_module(tmp_path):
    (tmp_path / "analyses").mkdir()
    (tmp_path / "__init__.py").write_text('"""Core.\n\n- ``dynamics``: x.\n"""\n')
    (tmp_path / "analyses" / "__init__.py").write_text('"""Analyses.\n\n- ``table1``: y.\n"""\n')
    for path in ("dynamics.py", "roots.py", "analyses/table1.py", "analyses/staged.py"):
        (tmp_path / path).write_text("")
    assert unlisted_modules(tmp_path) == {"core": ["roots"], "analyses": ["staged"]}
