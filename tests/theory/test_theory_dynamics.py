"""PoS recurrences: fixed points, derivatives, mirror monotonicity, 2-cycles, regimes, inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory


def _h_logit(L, l_ref, beta, eps):
    """Reference map written out by hand: L_ref + 1 / (beta sqrt(p(1-p) + eps)).

    p (1 - p) = e / (1 + e)^2 with e = exp(-|L|), exact for large |L|.
    """
    e = np.exp(-np.abs(L))
    return l_ref + 1 / (beta * np.sqrt(e / (1 + e) ** 2 + eps))


def _brute_force_count(l_ref, beta, eps):
    """Sign changes of h(L) - L on a dense grid covering every possible fixed point."""
    hi = l_ref + 1 / (beta * np.sqrt(eps)) + 1
    grid = np.unique(np.concatenate([np.linspace(l_ref, hi, 200_001),
                                     np.linspace(-60, 60, 200_001)]))
    grid = grid[(grid >= l_ref) & (grid <= hi)]
    g = _h_logit(grid, l_ref, beta, eps) - grid
    return int(np.sum(np.sign(g[1:]) != np.sign(g[:-1])))


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 3e-2])
def test_fixed_point_count_matches_brute_force(eps):
    p_ref = np.array([0.0007, 0.003, 0.02, 0.1, 0.35, 0.6, 0.9])
    beta = np.array([0.05, 0.3, 1.0, 3.0, 8.0, 30.0])
    roots = theory.fixed_points_logit(theory.logit(p_ref)[:, None], beta[None, :], eps=eps)
    counts = np.sum(~np.isnan(roots), axis=-1)
    seen = set()
    for i, pr in enumerate(p_ref):
        for j, b in enumerate(beta):
            l_ref = np.log(pr / (1 - pr))
            assert counts[i, j] == _brute_force_count(l_ref, b, eps), (pr, b)
            r = roots[i, j][: counts[i, j]]
            np.testing.assert_allclose(_h_logit(r, l_ref, b, eps), r, rtol=1e-12, atol=1e-12)
            seen.add(int(counts[i, j]))
    assert seen >= {1, 3} or eps > 1e-3  # small eps shows both one and three fixed points


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-6, 1 - 1e-6), st.floats(1e-2, 1e3),
       st.one_of(st.just(0.0), st.floats(1e-300, 0.5)),
       st.floats(0.05, 1.0), st.sampled_from(["sqrt", "std"]))
def test_fixed_points_amplify(p_ref, beta, eps, alpha, placement):
    # Theorem 3 (and its two-KL analogue): every interior fixed point exceeds p_ref
    kw = {"eps": eps, "eps_placement": placement, "alpha": alpha}
    roots = theory.fixed_points_logit(theory.logit(p_ref), beta, **kw)
    assert np.all(roots > theory.logit(p_ref))
    np.testing.assert_allclose(
        theory.pos_map_logit(roots, theory.logit(p_ref), beta, **kw) * 0
        + theory.logit(p_ref) + theory.omega_of_logit(roots, eps=eps, eps_placement=placement)
        / (alpha * beta), roots, rtol=1e-10, atol=1e-10)
    assert np.all(theory.fixed_points(p_ref, beta, **kw) >= p_ref)


def test_fixed_points_array_padding_and_special_cases():
    fp = theory.fixed_points([0.001, 0.3, 0.0, 1.0], 5.0)
    assert fp.shape[:-1] == (4,)
    assert np.all(np.isnan(fp[2:]))  # absorbing p_ref: no interior fixed point
    assert theory.fixed_points(0.3, 1.0, alpha=0.0).size == 0  # mirror (Theorem 5)
    assert np.isnan(theory.fixed_points([0.2, 0.4], 1.0, alpha=0.0)).all()


def test_mean_only_reference_reaches_fixed_point_in_one_step():
    p_ref, beta = np.array([0.01, 0.3, 0.8]), np.array([0.5, 2.0, 7.0])
    oracle = 1 / (1 + (1 - p_ref) / p_ref * np.exp(-1 / beta))  # sigmoid(L_ref + 1/beta)
    path = theory.iterate(p_ref, p_ref, beta, 3, normalization="mean_only")
    np.testing.assert_allclose(path[1:], np.broadcast_to(oracle, (3, 3)), rtol=1e-14)
    np.testing.assert_allclose(theory.fixed_points(p_ref, beta, normalization="mean_only")[:, 0],
                               oracle, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(-40, 20), st.floats(1e-2, 1e3), st.one_of(st.just(0.0), st.floats(1e-300, 0.3)),
       st.sampled_from(["mean_std", "mean_only"]))
def test_mirror_iterates_increase(l0, beta, eps, normalization):
    path = theory.iterate_logit(l0, 0.0, beta, 30, alpha=0.0, eps=eps,
                                normalization=normalization)
    finite = path[np.isfinite(path)]  # eps = 0 can overflow to +inf, which then stays
    assert np.all(np.diff(finite) > 0)
    assert np.all(path[finite.size:] == np.inf)


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.3])
@pytest.mark.parametrize("cal", [{"eps": 1e-3}, {"eps": 0.02, "eps_placement": "std"},
                                 {"group_size": 8, "ddof": 1}])
def test_map_derivative_matches_finite_differences(alpha, cal):
    p = np.linspace(0.05, 0.95, 19)
    h = 1e-7
    fd = (theory.pos_map(p + h, 0.2, 1.7, alpha=alpha, **cal)
          - theory.pos_map(p - h, 0.2, 1.7, alpha=alpha, **cal)) / (2 * h)
    np.testing.assert_allclose(theory.pos_map_derivative(p, 0.2, 1.7, alpha=alpha, **cal), fd,
                               rtol=1e-5, atol=1e-8)


def test_derivative_and_stability_bound_match_lemma_1():
    p, p_ref, beta, eps = np.linspace(0.01, 0.99, 50), 0.1, 0.8, 1e-3
    h = theory.pos_map(p, p_ref, beta, eps=eps)
    hand = -h * (1 - h) * (1 - 2 * p) / (2 * beta * (p * (1 - p) + eps) ** 1.5)
    np.testing.assert_allclose(theory.pos_map_derivative(p, p_ref, beta, eps=eps), hand,
                               rtol=1e-10)
    bound = p * (1 - p) * np.abs(2 * p - 1) / (2 * (p * (1 - p) + eps) ** 1.5)
    np.testing.assert_allclose(theory.stability_bound(p, eps=eps), bound, rtol=1e-10)
    # at a fixed point |h'(p*)| = B(p*) / beta
    star = theory.fixed_points(0.05, 2.0, eps=1e-5)[0]
    slope = theory.pos_map_derivative(star, 0.05, 2.0, eps=1e-5)
    np.testing.assert_allclose(abs(slope), theory.stability_bound(star, eps=1e-5) / 2.0,
                               rtol=1e-7)


def test_period_two_orbits_against_brute_force():
    l_ref, beta, eps = np.log(0.001 / 0.999), 5.0, 1e-5
    orbits = theory.period_two_orbits_logit(l_ref, beta, eps=eps)
    grid = np.linspace(l_ref, l_ref + 1 / (beta * np.sqrt(eps)) + 1, 400_001)
    f2 = _h_logit(_h_logit(grid, l_ref, beta, eps), l_ref, beta, eps) - grid
    n_roots = np.sum(np.sign(f2[1:]) != np.sign(f2[:-1]))
    n_fixed = theory.fixed_points_logit(l_ref, beta, eps=eps).size
    assert 2 * len(orbits) == n_roots - n_fixed
    for a, b in orbits:
        assert a < b
        np.testing.assert_allclose(_h_logit(a, l_ref, beta, eps), b, rtol=1e-9)
        np.testing.assert_allclose(_h_logit(b, l_ref, beta, eps), a, rtol=1e-9)


def test_classification_regimes():
    res = theory.classify_dynamics([0.05, 0.001, 0.3, 0.0, 0.2],
                                   [0.05, 0.001, 0.3, 0.0, 0.2],
                                   [2.0, 5.0, 1.0, 1.0, 1.0],
                                   alpha=[1.0, 1.0, 0.0, 1.0, 1.0], n_transient=400,
                                   n_measure=200)
    regimes = [theory.Regime(r) for r in res.regime]
    assert regimes[:4] == [theory.Regime.FIXED_POINT, theory.Regime.CYCLE_2,
                           theory.Regime.SATURATES, theory.Regime.ABSORBED]
    np.testing.assert_allclose(res.limits[0, 0], theory.fixed_points(0.05, 2.0)[0], rtol=1e-8)
    np.testing.assert_allclose(res.limits[1], theory.period_two_orbits(0.001, 5.0)[0],
                               rtol=1e-7)
    assert res.lyapunov[0] < 0 and res.lyapunov[1] < 0
    # Lyapunov exponent of the fixed point equals log |h'(p*)|
    star = res.limits[0, 0]
    np.testing.assert_allclose(res.lyapunov[0],
                               np.log(abs(theory.pos_map_derivative(star, 0.05, 2.0))),
                               rtol=1e-6)


def test_classification_finds_chaos_with_positive_lyapunov():
    p_ref = np.logspace(-5.5, -4, 25)
    beta = np.logspace(0.5, 1.3, 25)
    res = theory.classify_dynamics(p_ref[:, None], p_ref[:, None], beta[None, :],
                                   n_transient=300, n_measure=600)
    chaotic = (res.regime == theory.Regime.IRREGULAR) & (res.lyapunov > 0.05)
    assert chaotic.any()
    # independent check: nearby orbits separate at rate exp(lambda) (finite-difference tangent)
    i, j = np.argwhere(chaotic)[0]
    pr, b = p_ref[i], beta[j]
    L, total, d = theory.iterate_logit(theory.logit(pr), theory.logit(pr), b, 300)[-1], 0.0, 1e-9
    for _ in range(600):
        nxt = _h_logit(L, np.log(pr / (1 - pr)), b, 1e-5)
        moved = _h_logit(L + d, np.log(pr / (1 - pr)), b, 1e-5)
        total += np.log(abs(moved - nxt) / d)
        L = nxt
    assert abs(total / 600 - res.lyapunov[i, j]) < 0.15


def test_extreme_probabilities_stay_finite():
    path = theory.iterate_logit(-800.0, -800.0, 2.0, 50, eps=1e-5)
    assert np.isfinite(path).all()
    # p_ref = 0 is absorbing, p_ref = 1 stays at 1, with no NaN
    np.testing.assert_array_equal(theory.iterate(0.3, 0.0, 1.0, 5)[1:], 0.0)
    np.testing.assert_array_equal(theory.iterate(0.3, 1.0, 1.0, 5)[1:], 1.0)
    np.testing.assert_array_equal(theory.iterate(0.0, 0.4, 1.0, 5, alpha=0.0), 0.0)
    out = theory.pos_map(1e-300, 1e-300, 1.0, eps=0.0)
    assert np.isfinite(out) and out > 0
    # logit of the next step from p = 1e-300 with eps = 0: L_ref + Omega/beta, Omega = 1e150
    np.testing.assert_allclose(theory.pos_map_logit(np.log(1e-300), np.log(1e-300), 1.0,
                                                    eps=0.0), 1e150, rtol=1e-12)


@pytest.mark.parametrize(
    "call, match",
    [(lambda: theory.pos_map(0.2, 1.2, 1.0), "p_ref must be in"),
     (lambda: theory.pos_map(0.2, 0.3, -1.0), "beta must be > 0"),
     (lambda: theory.pos_map(0.2, 0.3, 1.0, alpha=2.0), "alpha must be in"),
     (lambda: theory.pos_map(0.2, 0.3, 1.0, eps=-1e-3), "eps must be"),
     (lambda: theory.pos_map(0.2, 0.3, 1.0, group_size=1), "group_size"),
     (lambda: theory.pos_map(0.0, 0.3, 1.0, eps=0.0), "eps=0"),
     (lambda: theory.pos_map(1.0, 0.0, 1.0, alpha=0.5), "no mass"),
     (lambda: theory.iterate(0.2, float("nan"), 1.0, 3), "NaN"),
     (lambda: theory.iterate(0.2, 0.3, 1.0, -1), "n_steps"),
     (lambda: theory.fixed_points(0.2, 0.0), "beta"),
     (lambda: theory.pos_map(0.2, 0.3, 1.0, normalization="z"), "normalization")],
)
def test_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_probability_path_is_the_sigmoid_of_the_logit_path():
    # the path of iterate() is converted row by row with 1 / (1 + exp(-L)); compare with
    # scipy's expit of iterate_logit(), including logits as extreme as p = 1e-300
    from scipy import special

    p_ref = np.array([1e-300, 1e-12, 0.2, 0.5, 0.9])[:, None]
    beta = np.array([0.5, 2.0, 50.0])[None, :]
    probs = theory.iterate(p_ref, p_ref, beta, 12, eps=1e-5)
    logits = theory.iterate_logit(theory.logit(p_ref), theory.logit(p_ref), beta, 12, eps=1e-5)
    expected = special.expit(logits)
    np.testing.assert_allclose(probs, expected, rtol=4e-16, atol=0)
    assert probs[0, 0, 0] == pytest.approx(1e-300, rel=1e-14)
