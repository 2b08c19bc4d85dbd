"""theory.analyses.seed_statistics against scipy.stats (ttest_rel, sem) and by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from grpo_companion.theory.analyses import seed_statistics as ss


@pytest.mark.parametrize("shape, axis", [((5,), 0), ((4, 7), 0), ((3, 6), -1), ((2, 4, 3), 1)])
def test_mean_and_standard_error_match_scipy_sem(shape, axis):
    x = np.random.default_rng(1).normal(size=shape)
    mean, se = ss.mean_and_standard_error(x, axis=axis)
    np.testing.assert_allclose(mean, np.mean(x, axis=axis), rtol=1e-14)
    np.testing.assert_allclose(se, stats.sem(x, axis=axis, ddof=1), rtol=1e-13)


@pytest.mark.parametrize("n_seeds, n_k", [(2, 1), (3, 5), (6, 256)])
def test_paired_difference_is_scipy_ttest_rel(n_seeds, n_k):
    rng = np.random.default_rng(n_seeds)
    before = rng.random((n_seeds, n_k))
    after = before + rng.normal(0.02, 0.05, size=(n_seeds, n_k))
    pd = ss.paired_difference(after, before)
    ref = stats.ttest_rel(after, before, axis=0)
    np.testing.assert_allclose(pd.t, ref.statistic, rtol=1e-10)
    np.testing.assert_allclose(pd.p_value(), ref.pvalue, rtol=1e-10)
    np.testing.assert_allclose(pd.mean, (after - before).mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(pd.standard_error, stats.sem(after - before, axis=0), rtol=1e-13)
    assert pd.n_seeds == n_seeds
    np.testing.assert_array_equal(pd.beyond(3.0), np.abs(ref.statistic) > 3.0)


def test_paired_difference_on_the_last_axis_and_without_spread():
    before = np.zeros((2, 4))
    after = np.array([[0.0, 1.0, 0.5, 0.0], [0.0, 1.0, 0.5, -0.5]])
    pd = ss.paired_difference(after.T, before.T, axis=-1)
    # no difference at all: t = 0; the same non-zero difference on both seeds: t = +inf
    assert pd.t[0] == 0.0 and pd.t[1] == np.inf and pd.t[2] == np.inf
    assert pd.t[3] == pytest.approx(stats.ttest_rel(after[:, 3], before[:, 3]).statistic)
    np.testing.assert_array_equal(pd.beyond(), [False, True, True, False])
    assert ss.t_p_value(np.inf, 2) == 0.0


def test_t_p_value_is_twice_the_t_tail():
    t = np.array([-4.0, -1.0, 0.0, 2.5])
    np.testing.assert_allclose(ss.t_p_value(t, 5), 2 * stats.t.sf(np.abs(t), 4), rtol=1e-14)


@pytest.mark.parametrize("call, name", [
    (lambda: ss.mean_and_standard_error([1.0]), "values"),
    (lambda: ss.mean_and_standard_error([[1.0, 2.0]]), "values"),
    (lambda: ss.mean_and_standard_error([1.0, np.nan]), "values"),
    (lambda: ss.mean_and_standard_error([1.0, 2.0], axis=1), "axis"),
    (lambda: ss.mean_and_standard_error([1.0, 2.0], axis=0.5), "axis"),
    (lambda: ss.paired_difference([1.0, 2.0], [1.0, 2.0, 3.0]), "before"),
    (lambda: ss.paired_difference([1.0, np.inf], [1.0, 2.0]), "after"),
    (lambda: ss.t_p_value(1.0, 1), "n_seeds"),
    (lambda: ss.t_p_value(np.nan, 3), "t"),
    (lambda: ss.paired_difference([1.0, 2.0], [0.0, 0.0]).beyond(-1.0), "n_se"),
])
def test_bad_input_names_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("axis", [0, -1, None])
def test_t_statistic_is_scipy_ttest_1samp(axis):
    x = np.random.default_rng(5).normal(0.1, 1.0, size=(6, 4))
    ref = stats.ttest_1samp(x, 0.0, axis=axis)
    np.testing.assert_allclose(ss.t_statistic(x, axis=axis), ref.statistic, rtol=1e-12)
    np.testing.assert_allclose(ss.t_p_value(ss.t_statistic(x, axis=axis),
                                            x.size if axis is None else x.shape[axis]),
                               ref.pvalue, rtol=1e-10)


def test_axis_none_pools_every_entry():
    x = np.arange(12.0).reshape(3, 4)
    mean, se = ss.mean_and_standard_error(x, axis=None)
    assert mean == pytest.approx(5.5)
    assert se == pytest.approx(stats.sem(x.ravel()))
    with pytest.raises(ValueError, match="values"):
        ss.mean_and_standard_error([[1.0]], axis=None)
