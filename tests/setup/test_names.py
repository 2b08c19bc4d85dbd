"""One name per concept, one concept per name (issue 22, item 5): the dropped names stay dropped.

Each test fails if a removed alias comes back:

- ``theory.expit`` (an alias of ``theory.sigmoid``; ``sigmoid`` is the one the book writes);
- the calibration preset ``"dr_grpo"`` (now ``"mean_only"``, named after its normalisation like
  ``"rloo"`` and ``"max_abs"``), so that ``"dr_grpo"`` is only TRL's ``loss_type``;
- ``trl_bridge.TheorySettings`` / ``theory_settings`` and ``trl_facts.TheoryReading`` /
  ``reading``: one object, :class:`~grpo_companion.practice.trl_bridge.TheoryReading`;
- ``old`` (or ``previous``) for the previous policy ``pi_{n-1}`` in public parameters and
  fields of ``theory``, ``symbolic``, ``practice`` and ``rl`` (the name is ``prev``);
- bare ``plus`` / ``minus`` as public parameters or fields (``gain_plus``/``gain_minus`` for
  a group's gains, ``w_plus``/``w_minus`` for the weights).

The source checks read the files with :mod:`ast`, so they need no optional dependency.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from grpo_companion import theory
from grpo_companion.theory import logistic
from grpo_companion.theory.variants import calibration_named

PACKAGE = Path(__file__).resolve().parents[2] / "grpo_companion"
CHECKED = ("theory", "symbolic", "practice", "rl")


def _public_names(sub: str) -> list[tuple[str, str]]:
    """``(where, name)`` for every public function, parameter and class field of ``sub``."""
    out = []
    for path in sorted((PACKAGE / sub).rglob("*.py")):
        if path.name.startswith("_") and path.name != "__init__.py":
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name.startswith("_"):
                    continue
                out.append((rel, node.name))
                args = node.args
                for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
                    out.append((f"{rel}:{node.name}", a.arg))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        out.append((f"{rel}:{node.name}", item.target.id))
    return out


def test_sigmoid_has_no_alias() -> None:
    assert "sigmoid" in theory.__all__
    assert "expit" not in theory.__all__ and not hasattr(theory, "expit")
    assert "expit" not in logistic.__all__ and not hasattr(logistic, "expit")


def test_dr_grpo_is_not_a_calibration_preset() -> None:
    assert "dr_grpo" not in theory.CALIBRATIONS
    assert theory.CALIBRATIONS["mean_only"] == theory.Calibration("mean_only")
    with pytest.raises(ValueError, match="calibration must be one of"):
        calibration_named("dr_grpo")


def test_one_theory_reading() -> None:
    bridge = importlib.import_module("grpo_companion.practice.trl_bridge")
    facts = importlib.import_module("grpo_companion.practice.trl_facts")
    for module, gone in ((bridge, ("TheorySettings", "theory_settings")),
                         (facts, ("reading",))):
        for name in gone:
            assert not hasattr(module, name), f"{module.__name__}.{name} is back"
            assert name not in module.__all__
    # trl_facts imports the class for its annotations; it must not define one of its own
    assert getattr(facts, "TheoryReading", bridge.TheoryReading) is bridge.TheoryReading
    assert "TheoryReading" not in facts.__all__
    assert callable(bridge.theory_reading) and callable(facts.installed_reading)
    practice = importlib.import_module("grpo_companion.practice")
    assert practice.TheoryReading is bridge.TheoryReading
    assert not hasattr(practice, "TheorySettings")


@pytest.mark.parametrize("sub", CHECKED)
def test_previous_policy_is_prev(sub: str) -> None:
    old = re.compile(r"(^|_)(old|previous)(_|$)")
    found = sorted(f"{where}:{name}" for where, name in _public_names(sub) if old.search(name))
    assert not found, found


@pytest.mark.parametrize("sub", CHECKED)
def test_no_bare_plus_or_minus(sub: str) -> None:
    found = [f"{where}:{name}" for where, name in _public_names(sub)
             if name in ("plus", "minus")]
    assert not found, found
