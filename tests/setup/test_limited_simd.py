"""The limited-SIMD step of ``make test`` (scripts/limited_simd.py, Makefile)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

from ._load import ROOT

SCRIPT = str(ROOT / "scripts" / "limited_simd.py")


def _check(disabled: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": disabled}
    return subprocess.run([sys.executable, SCRIPT, "--check"], env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_printed_targets_turn_every_dispatch_target_off():
    names = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True,
                           check=True).stdout.split()
    assert names == list(__cpu_dispatch__)
    done = _check(" ".join(names))
    assert done.returncode == 0, done.stderr
    assert "baseline kernels" in done.stdout


@pytest.mark.skipif(not any(__cpu_features__.get(n) for n in __cpu_dispatch__),
                    reason="this CPU has no SIMD target above numpy's baseline")
def test_the_check_fails_when_a_target_is_left_on():
    done = _check("")
    assert done.returncode == 1
    assert "still on" in done.stderr


def test_the_makefile_runs_the_numeric_tests_with_the_check():
    text = (ROOT / "Makefile").read_text()
    assert 'NPY_DISABLE_CPU_FEATURES="$$($(PY) scripts/limited_simd.py)"' in text
    assert "scripts/limited_simd.py --check &&" in text
    assert "NUMERIC_TESTS := tests/theory tests/symbolic tests/variants" in text
