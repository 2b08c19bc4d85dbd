"""Contracts of the normalisation registry: gains are checked where they are used.

- every group size's advantage table is checked for finite, non-negative gains
  (not only the few sizes tried at registration);
- a ``gains`` that only runs on numpy (``np.sqrt`` instead of ``ops.sqrt``) is
  refused at registration, not at the first symbolic call;
- a :class:`Calibration` keeps the function it was built with, also through
  ``dataclasses.replace``, copies and pickling, after ``replace=True``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest

import grpo_companion.theory as theory
from grpo_companion.theory import Calibration, register_normalization, unregister_normalization
from grpo_companion.theory.finite_group import group_table


@pytest.fixture
def registered():
    """Register normalisations for one test and remove them afterwards."""
    names: list[str] = []

    def add(name, gains, **kwargs):
        register_normalization(name, gains, summary="test only", **kwargs)
        names.append(name)

    yield add
    for name in names:
        if name in theory.NORMALIZATIONS:
            unregister_normalization(name)


def _negative_at_16(succ, fail, n, cal, ops):
    """Mean-only gains, except that groups of 16 give some successes a negative gain."""
    return (fail - 0.2 if n == 16 else fail), succ


def _nan_at_5_of_16(succ, fail, n, cal, ops):
    """Mean-only gains, except NaN for a success in a group of 16 with 5 successes."""
    if n == 16:
        return np.where(np.isclose(succ, 5 / 16), np.nan, fail), succ
    return fail, succ


def test_negative_gains_for_one_group_size_are_refused_where_that_size_is_used(registered):
    registered("neg_at_16", _negative_at_16)  # n = 2, 3, 8 at registration look fine
    cal = Calibration("neg_at_16", group_size=16)
    for call in (lambda: cal.weights(0.5), lambda: group_table(Calibration("neg_at_16"), 16),
                 lambda: theory.fixed_points(0.3, 1.0, calibration=cal)):
        with pytest.raises(ValueError, match=r"neg_at_16.*group size 16.*k = 13"):
            call()
    # other group sizes stay usable
    assert np.isfinite(Calibration("neg_at_16", group_size=8).omega(0.5))


def test_nan_gains_at_one_k_raise_instead_of_nan_weights_or_no_fixed_point(registered):
    registered("nan_at_5", _nan_at_5_of_16)
    with pytest.raises(ValueError, match=r"nan_at_5.*not finite.*group size 16.*k = 5"):
        theory.weights(0.5, normalization="nan_at_5", group_size=16)
    with pytest.raises(ValueError, match=r"nan_at_5.*not finite.*group size 16.*k = 5"):
        theory.fixed_points(0.3, 1.0, normalization="nan_at_5", group_size=16)


def _numpy_only_sqrt(succ, fail, n, cal, ops):
    scale = np.sqrt(succ * fail + cal.eps)  # should be ops.sqrt
    return fail / scale, succ / scale


def _numpy_only_maximum(succ, fail, n, cal, ops):
    top = np.maximum(succ, fail)  # should be ops.maximum
    return fail / top, succ / top


@pytest.mark.parametrize("gains", [_numpy_only_sqrt, _numpy_only_maximum])
def test_gains_that_only_run_on_numpy_are_refused_at_registration(registered, gains):
    with pytest.raises(ValueError, match=r"numpy_only.*SymPy.*ops\.sqrt"):
        registered("numpy_only", gains)
    assert "numpy_only" not in theory.NORMALIZATIONS


def test_gains_written_with_ops_still_register_and_run_symbolically(registered):
    def smooth(succ, fail, n, cal, ops):
        scale = ops.sqrt(succ * fail + cal.eps)
        return fail / scale, succ / scale

    registered("ops_sqrt", smooth, uses_eps=True)
    from grpo_companion.symbolic.calibration import calibration_weights

    assert calibration_weights(Calibration("ops_sqrt")).omega is not None


def _ones(succ, fail, n, cal, ops):
    return fail, succ  # Omega = 1


def _threes(succ, fail, n, cal, ops):
    return 3 * fail, 3 * succ  # Omega = 3


def test_a_calibration_keeps_the_function_it_was_built_with(registered):
    registered("rebound", _ones)
    registered("same_as_ones", _ones)
    old = Calibration("rebound")
    old_group = Calibration("rebound", group_size=4)
    registered("rebound", _threes, replace=True)
    new = Calibration("rebound")
    assert float(old.omega(0.5)) == pytest.approx(1.0)
    want_group = Calibration("same_as_ones", group_size=4).omega(0.5)
    np.testing.assert_allclose(old_group.omega(0.5), want_group)
    assert float(new.omega(0.5)) == pytest.approx(3.0)
    assert old.definition.gains is _ones and new.definition.gains is _threes
    # dataclasses.replace (how rl/long_run and trl_bridge set G) keeps the bound function
    grown = dataclasses.replace(old, group_size=4)
    assert grown.definition.gains is _ones
    np.testing.assert_allclose(grown.omega(0.5), old_group.omega(0.5))
    # so do copies and pickling (run_seeds sends calibrations to worker processes)
    for twin in (copy.copy(old), copy.deepcopy(old), pickle.loads(pickle.dumps(old))):
        assert twin.definition.gains is _ones
        assert twin == old and hash(twin) == hash(old)
        assert float(twin.omega(0.5)) == pytest.approx(1.0)
    # equal parameters with different functions are different calibrations
    assert old != new
    # replacing the name picks that name's registration
    assert dataclasses.replace(old, normalization="mean_only").definition \
        is theory.NORMALIZATIONS["mean_only"]


def test_builtin_calibrations_compare_hash_and_pickle_as_before():
    cal = Calibration("mean_std", eps=1e-3, group_size=4)
    cal.omega(0.3)  # fill the caches; they must not travel with a pickle
    cal.omega_sup  # noqa: B018
    twin = pickle.loads(pickle.dumps(cal))
    assert twin == cal and hash(twin) == hash(cal)
    assert twin == Calibration("mean_std", eps=1e-3, group_size=4)
    assert "definition" not in [f.name for f in dataclasses.fields(Calibration)]
    assert dataclasses.asdict(cal) == {"normalization": "mean_std", "eps": 1e-3,
                                       "eps_placement": "sqrt", "group_size": 4, "ddof": 0}
    assert dataclasses.replace(cal, group_size=None) == Calibration("mean_std", eps=1e-3)
    np.testing.assert_array_equal(twin.omega([0.1, 0.5]), cal.omega([0.1, 0.5]))


def test_generic_calibration_with_sympy_cache_still_pickles(registered):
    registered("picklable", _ones)
    cal = Calibration("picklable")
    cal.omega_prime(0.3)  # compiles a SymPy derivative into the cache
    twin = pickle.loads(pickle.dumps(cal))
    assert twin == cal
    np.testing.assert_allclose(twin.omega_prime(0.3), cal.omega_prime(0.3))
