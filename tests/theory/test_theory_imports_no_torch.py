"""The theory package is numpy/scipy (and SymPy on demand): no module of it may pull in torch."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import grpo_companion.theory as theory
names = [m.name for m in pkgutil.walk_packages(theory.__path__, "grpo_companion.theory.")]
for name in names:  # the core modules and those of theory.analyses
    importlib.import_module(name)
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(len(names), len(bad))
"""


def test_no_theory_module_imports_torch():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         check=True).stdout.split()
    n_modules, n_torch = int(out[0]), int(out[1])
    assert n_modules >= 20  # every module was imported, not an empty package
    assert n_torch == 0, "a module under grpo_companion/theory imports torch"
