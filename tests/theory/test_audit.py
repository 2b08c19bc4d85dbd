"""``theory.audit_calibration`` against a census made independently of ``theory.roots``.

The independent census scans the fixed-point function ``g(L) = L_ref + Omega(L) / beta - L``
of each cell on a dense logit grid (``Omega`` from the calibration's own
``omega_of_logit``), counts its sign changes and refines each by Brent's method. Every
fixed point has ``L* - L_ref = Omega(L*) / beta`` between ``inf Omega / beta`` and
``sup Omega / beta``, so the scan covers that interval and a margin.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from grpo_companion import theory
from grpo_companion.theory.audit import CalibrationAudit

N = 7
P_BOUNDS = (1e-4, 1 - 1e-4)
BETA_BOUNDS = (0.1, 20.0)


def _power_whitening(xi):
    def gains(succ, fail, n, cal, ops):
        var = succ * fail if n is None else succ * fail * n / (n - cal.ddof)
        scale = (ops.sqrt(var + cal.eps) if cal.eps_placement == "sqrt"
                 else ops.sqrt(var) + cal.eps) ** xi
        return fail / scale, succ / scale
    return gains


@pytest.fixture(scope="module")
def power():
    theory.register_normalization("audit_test_power", _power_whitening(0.5),
                                  summary="power whitening for the audit test", uses_eps=True,
                                  uses_ddof=True)
    yield theory.Calibration("audit_test_power", eps=1e-5)
    theory.unregister_normalization("audit_test_power")


def _independent_census(cal):
    p_ref = theory.sigmoid(np.linspace(theory.logit(P_BOUNDS[0]), theory.logit(P_BOUNDS[1]), N))
    betas = np.exp(np.linspace(math.log(BETA_BOUNDS[0]), math.log(BETA_BOUNDS[1]), N))
    counts, lifts = [], []
    for beta in betas:
        for lr in theory.logit(p_ref):
            lo = lr + cal.omega_inf / beta - 1.0
            hi = lr + cal.omega_sup / beta + 1.3  # margins unequal: no root on a node
            grid = np.linspace(lo, hi, 400_001)
            g = lr + cal.omega_of_logit(grid) / beta - grid

            def gap(x, lr=lr, beta=beta):
                return lr + float(cal.omega_of_logit(x)) / beta - x

            roots = [optimize.brentq(gap, grid[i], grid[i + 1], xtol=1e-13)
                     for i in np.flatnonzero(np.sign(g[:-1]) * np.sign(g[1:]) < 0)]
            counts.append(len(roots))
            lifts += [beta * (r - lr) for r in roots]
    counts = np.array(counts)
    return counts, np.array(lifts)


@pytest.mark.parametrize("name", ["paper", "trl", "mean_only", "power"])
def test_census_matches_an_independent_scan(name, power):
    cal = power if name == "power" else theory.CALIBRATIONS[name]
    audit = theory.audit_calibration(cal, n_grid=N, p_ref_bounds=P_BOUNDS,
                                     beta_bounds=BETA_BOUNDS)
    counts, lifts = _independent_census(cal)
    assert isinstance(audit, CalibrationAudit)
    assert audit.n_cells == N * N
    assert audit.points == counts.sum()
    assert audit.share3 == pytest.approx(np.mean(counts == 3), abs=0)
    assert audit.every_cell == bool(np.all(counts >= 1))
    assert audit.all_above == bool(np.all(lifts > 0))
    assert audit.min_lift == pytest.approx(lifts.min(), rel=1e-9)
    assert audit.omega_inf == pytest.approx(float(cal.omega(0.5)), rel=1e-12)  # U-shaped or flat
    assert audit.amplifies  # Theorem 3: every registered calibration has Omega > 0
    if name == "paper":
        assert audit.share3 > 0  # the grid reaches the fold: the comparison has power


def test_the_lift_bound_is_tight_for_centring():
    """Dr. GRPO's Omega is 1 everywhere, so every lift is exactly 1 = inf Omega."""
    audit = theory.audit_calibration(theory.CALIBRATIONS["mean_only"], n_grid=5)
    assert audit.points == 25 and audit.share3 == 0
    assert audit.min_lift == pytest.approx(1.0, rel=1e-9) and audit.omega_inf == 1.0


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n_grid": 1}, "n_grid"), ({"n_grid": 2.0}, "n_grid"),
    ({"p_ref_bounds": (0.2, 1.0)}, "p_ref_bounds"), ({"p_ref_bounds": (0.0, 0.5)}, "p_ref_bounds"),
    ({"beta_bounds": (1.0, 0.5)}, "beta_bounds"), ({"beta_bounds": (0.0, 1.0)}, "beta_bounds"),
    ({"calibration": "paper"}, "calibration")])
def test_bad_input_names_the_parameter(kwargs, name):
    call = {"calibration": theory.CALIBRATIONS["paper"], **kwargs}
    with pytest.raises(ValueError, match=name):
        theory.audit_calibration(**call)
