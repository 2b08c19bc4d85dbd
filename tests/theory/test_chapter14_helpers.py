"""Chapter 14's computations moved to the library (issue 22, item 4), each against an
independent computation: the mean pass@k against exact rational sums over the binomial
distribution and a Monte Carlo of k draws, the crossover against scipy.stats.ttest_rel,
and the rounds to settle against a direct scan of the definition."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats
from scipy.special import logit

from grpo_companion.theory.analyses import clipped
from grpo_companion.theory.analyses import sample_weighting as sw


def _pass_at_k_exact(p: Fraction, k: int) -> Fraction:
    """P(at least one success in k independent draws), summed over the binomial law."""
    return sum((math.comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(1, k + 1)),
               Fraction(0))


def test_mean_pass_at_k_against_exact_binomial_sums():
    ps = [Fraction(1, 50), Fraction(1, 4), Fraction(3, 5), Fraction(9, 10)]
    ks = np.array([1, 2, 5, 16, 40])
    logits = logit(np.array([float(p) for p in ps]))
    # two "seeds": the same prompts, and their first two only
    got = sw.mean_pass_at_k_of_logit(np.stack([logits, logits[[0, 1, 0, 1]]]), ks)
    assert got.shape == (2, ks.size)
    for row, prompts in zip(got, (ps, [ps[0], ps[1], ps[0], ps[1]]), strict=True):
        want = [float(sum(_pass_at_k_exact(p, int(k)) for p in prompts) / len(prompts))
                for k in ks]
        np.testing.assert_allclose(row, want, rtol=1e-13)


def test_mean_pass_at_k_against_monte_carlo():
    rng = np.random.default_rng(7)
    p = np.array([0.01, 0.1, 0.5])
    k, n_trials = 8, 200_000
    hits = (rng.random((n_trials, p.size, k)) < p[:, None]).any(axis=-1).mean(axis=0)
    mc, mc_se = hits.mean(), hits.std() / np.sqrt(n_trials)  # loose: prompts share trials
    exact = sw.mean_pass_at_k_of_logit(logit(p), k)
    assert exact.shape == ()
    assert abs(exact - mc) < 5 * max(mc_se, 1e-3)
    np.testing.assert_allclose(exact, np.mean(1 - stats.binom.pmf(0, k, p)), rtol=1e-13)


def test_mean_pass_at_k_keeps_the_shape_of_k_and_refuses_bad_input():
    logits = np.zeros((3, 4))
    assert sw.mean_pass_at_k_of_logit(logits, np.ones((2, 5))).shape == (3, 2, 5)
    np.testing.assert_allclose(sw.mean_pass_at_k_of_logit(logits, [1, 2]), [[0.5, 0.75]] * 3)
    for bad, name in ((0.3, "logit_p"), (np.zeros((2, 0)), "logit_p"), ([np.nan], "logit_p")):
        with pytest.raises(ValueError, match=name):
            sw.mean_pass_at_k_of_logit(bad, [1, 2])
    with pytest.raises(ValueError, match="k"):
        sw.mean_pass_at_k_of_logit([0.0], [-1])


def _crossover_by_ttest(before, after, ks, n_se=3.0):
    """The criterion written with scipy's paired t-test (where the spread is not 0)."""
    t = stats.ttest_rel(after, before, axis=0).statistic
    t = np.where(np.isnan(t), 0.0, t)
    win = bool(t[0] > n_se)
    lose = t[1:] < -n_se
    first = int(ks[1:][lose][0]) if win and lose.any() else None
    return first, win, bool(lose.any())


@pytest.mark.parametrize("case", range(6))
def test_pass_at_k_crossover_is_the_paired_t_criterion(case):
    rng = np.random.default_rng(case)
    ks = np.arange(1, 33)
    n_seeds = 3 + case % 3
    before = np.sort(rng.random((n_seeds, ks.size)), axis=1)
    shift = np.linspace(0.2, -0.2, ks.size) if case % 2 else np.linspace(0.1, 0.05, ks.size)
    after = before + shift + rng.normal(0, 0.02, size=before.shape)
    got = sw.pass_at_k_crossover(before, after, ks)
    assert tuple(got) == _crossover_by_ttest(before, after, ks)
    assert (got.first_k is not None) == bool(case % 2)


def test_pass_at_k_crossover_refuses_bad_input():
    ok = np.zeros((2, 3))
    with pytest.raises(ValueError, match="k"):
        sw.pass_at_k_crossover(ok, ok, [3, 2, 1])
    with pytest.raises(ValueError, match="after"):
        sw.pass_at_k_crossover(ok, np.zeros((2, 4)), [1, 2, 3])
    with pytest.raises(ValueError, match="after"):
        sw.pass_at_k_crossover(np.zeros((1, 3)), np.zeros((1, 3)), [1, 2, 3])
    with pytest.raises(ValueError, match="before"):
        sw.pass_at_k_crossover(np.zeros((2, 2)), ok, [1, 2, 3])
    with pytest.raises(ValueError, match="n_se"):
        sw.pass_at_k_crossover(ok, ok, [1, 2, 3], n_se=-1.0)


def _rounds_by_scan(path, tol):
    """The smallest n with abs(path[m] - path[-1]) <= tol for every m >= n, by brute force."""
    return next(n for n in range(len(path))
                if all(abs(path[m] - path[-1]) <= tol for m in range(n, len(path))))


@pytest.mark.parametrize("tol", [1e-6, 1e-3, 0.1])
def test_rounds_to_settle_against_the_definition(tol):
    rng = np.random.default_rng(3)
    paths = (0.5 + 0.4 * 0.7 ** np.arange(40),  # geometric approach
             0.3 + 0.2 * (-0.8) ** np.arange(60),  # oscillating approach
             np.full(5, 0.25),  # already there
             rng.random(12))
    for path in paths:
        assert clipped.rounds_to_settle(path, tol) == _rounds_by_scan(path, tol)
    L0 = logit(0.01)
    path = clipped.clipped_iterate_logit(L0, L0, 0.5, 0.2, 60)
    assert clipped.rounds_to_settle(path, tol) == _rounds_by_scan(path, tol)


@pytest.mark.parametrize("bad, name", [([], "path"), ([[0.1, 0.2]], "path"),
                                       ([0.1, np.nan], "path"), ([0.1, np.inf], "path"),
                                       ("x", "path")])
def test_rounds_to_settle_refuses_bad_paths(bad, name):
    with pytest.raises(ValueError, match=name):
        clipped.rounds_to_settle(bad)
    with pytest.raises(ValueError, match="tol"):
        clipped.rounds_to_settle([0.1, 0.2], tol=0.0)
