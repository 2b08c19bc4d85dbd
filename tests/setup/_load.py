"""Load a stand-alone script of ``scripts/`` as a module (they are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    """``scripts/NAME.py`` as the module ``grpo_NAME`` (the name tests/book/browser.py uses)."""
    module_name = f"grpo_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
