"""PoS dynamics: derivative, Lemma 1, Theorems 3-5, Section 5, Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from grpo_companion import theory
from grpo_companion.symbolic import dynamics as dyn
from grpo_companion.symbolic.policy import pos_map
from grpo_companion.symbolic.symbols import beta, eps, lambdify, p, p_ref
from grpo_companion.symbolic.two_kl import delta_renyi, p_star


def random_params(n: int = 200, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "p": rng.uniform(0.02, 0.98, n),
        "p_ref": rng.uniform(0.02, 0.98, n),
        "beta": 10 ** rng.uniform(-0.5, 1, n),
        "eps": 10 ** rng.uniform(-6, -1, n),
        "alpha": rng.uniform(0.05, 0.95, n),
    }


ANCHOR_ALPHA = {"reference": 1.0, "mirror": 0.0}


@pytest.mark.parametrize("anchor", ["reference", "mirror", "two_kl"])
def test_map_derivative_matches_theory(anchor):
    derivative = theory.pos_map_derivative
    d = dyn.map_derivative("mean_std", "sqrt", anchor)
    f, g = lambdify(d.derivative), lambdify(d.factored)
    prm = random_params()
    alphas = np.full(200, ANCHOR_ALPHA[anchor]) if anchor in ANCHOR_ALPHA else prm["alpha"]
    args = (prm["p"], prm["p_ref"], prm["beta"], prm["eps"], alphas)
    ours, factored = f(*args), g(*args)
    np.testing.assert_allclose(ours, factored, rtol=1e-8, atol=1e-12)
    for i in range(200):
        theirs = derivative(prm["p"][i], prm["p_ref"][i], prm["beta"][i], alpha=alphas[i],
                            eps=prm["eps"][i])
        assert float(theirs) == pytest.approx(ours[i], rel=1e-9, abs=1e-13)


def test_proposition1_derivative_form():
    d = dyn.map_derivative()
    h = pos_map().next_prob
    prop1 = -h * (1 - h) * (1 - 2 * p) / (2 * beta * (p * (1 - p) + eps) ** sp.Rational(3, 2))
    f = lambdify(d.derivative - prop1)
    prm = random_params()
    np.testing.assert_allclose(f(*prm.values()), 0, atol=1e-12)


def test_lemma1_at_theory_fixed_points():
    fixed_points = theory.fixed_points
    lemma = sp.lambdify((p_star, beta, eps), dyn.lemma1_derivative().rhs, "numpy")
    exact = lambdify(dyn.map_derivative().derivative)
    bound = sp.lambdify((p_star, eps), dyn.stability_bound(), "numpy")
    stability = theory.stability_bound
    rng = np.random.default_rng(4)
    checked = 0
    for _ in range(60):
        pr, b, e = rng.uniform(0.01, 0.9), 10 ** rng.uniform(-1, 1), 10 ** rng.uniform(-5, -1)
        for x in fixed_points(pr, b, eps=e):
            if not 1e-9 < x < 1 - 1e-9:
                continue
            assert x > pr  # Theorem 3
            slope = lemma(x, b, e)
            assert exact(x, pr, b, e, 1.0) == pytest.approx(slope, rel=1e-6, abs=1e-9)
            assert float(stability(x, eps=e)) == pytest.approx(bound(x, e), rel=1e-10)
            assert (abs(slope) < 1) == (b > bound(x, e))
            checked += 1
    assert checked > 30


def test_amplification_theorem3():
    amp = dyn.amplification()
    assert amp.positive and amp.increment_positive
    f = sp.lambdify((p_ref, sp.Symbol("d", positive=True)), amp.gap - amp.factored, "numpy")
    rng = np.random.default_rng(5)
    np.testing.assert_allclose(f(rng.uniform(0.01, 0.99, 200), rng.uniform(0, 20, 200)), 0,
                               atol=1e-12)


@pytest.mark.parametrize(("normalization", "placement"),
                         [("mean_std", "sqrt"), ("mean_std", "std"), ("mean_only", "sqrt")])
def test_mirror_increment_matches_theory(normalization, placement):
    pos_map_logit = theory.pos_map_logit
    inc = dyn.mirror_increment(normalization, placement)
    f = sp.lambdify((p, beta, eps), inc, "numpy")
    prm = random_params()
    theory_placement = placement
    for i in range(50):
        lp = np.log(prm["p"][i] / (1 - prm["p"][i]))
        step = pos_map_logit(lp, 0.0, prm["beta"][i], alpha=0.0, eps=prm["eps"][i],
                             normalization=normalization, eps_placement=theory_placement)
        assert float(step) - lp == pytest.approx(
            np.broadcast_to(f(prm["p"][i], prm["beta"][i], prm["eps"][i]), ()), rel=1e-9
        )
        assert f(prm["p"][i], prm["beta"][i], prm["eps"][i]) > 0


def test_dr_grpo_one_step_and_mirror_progression():
    dr = dyn.dr_grpo()
    assert dr.second_step_gap == 0
    iterate = theory.iterate
    f = sp.lambdify((p_ref, beta), dr.first_step, "numpy")
    n = sp.Symbol("n", integer=True, nonnegative=True)
    g = sp.lambdify((p_ref, beta, n), dr.mirror_logits, "numpy")
    for pr, b in [(0.1, 0.5), (0.6, 2.0), (0.02, 5.0)]:
        traj = iterate(pr, pr, b, 5, normalization="mean_only")
        np.testing.assert_allclose(traj[1:], f(pr, b), rtol=1e-12)
        traj = iterate(pr, pr, b, 5, alpha=0.0, normalization="mean_only")
        np.testing.assert_allclose(np.log(traj / (1 - traj)), g(pr, b, np.arange(6)), rtol=1e-10)


def test_beta_eff_equivalence():
    eq = dyn.beta_eff_equivalence()
    theory_map = theory.pos_map
    f = sp.lambdify((p, beta, eps), eq.rhs, "numpy")
    prm = random_params(50)
    for i in range(50):
        a, b, e, pp, pr = prm["alpha"][i], prm["beta"][i], prm["eps"][i], prm["p"][i], \
            prm["p_ref"][i]
        std = theory_map(pp, pr, b, alpha=a, eps=e)
        mean_only = theory_map(pp, pr, f(pp, b, e), alpha=a, normalization="mean_only")
        assert float(std) == pytest.approx(float(mean_only), rel=1e-12)


def test_two_kl_fixed_point_table1():
    eq = dyn.two_kl_fixed_point()
    fixed_points = theory.fixed_points
    residual = sp.lambdify((p_star, p_ref, beta, eps, sp.Symbol("alpha", positive=True)),
                           (eq.lhs - eq.rhs).subs(delta_renyi, 0), "numpy")
    rng = np.random.default_rng(6)
    for _ in range(30):
        pr, b, a = rng.uniform(0.01, 0.9), 10 ** rng.uniform(-0.5, 1), rng.uniform(0.1, 0.9)
        roots = fixed_points(pr, b, alpha=a, eps=1e-3)
        np.testing.assert_allclose(roots, fixed_points(pr, a * b, eps=1e-3), rtol=1e-10)
        for x in roots[roots < 1 - 1e-9]:  # roots within float64 of 1 print as 1.0
            # a float64 root carries a logit error of about 1e-16 / (x (1 - x))
            assert residual(x, pr, b, 1e-3, a) == pytest.approx(0, abs=1e-12 / (x * (1 - x)))


def test_table1_two_kl_map_is_not_a_contraction_in_general():
    """Table 1 calls the two-KL mean+var map an affine contraction in log-odds;
    it can have three fixed points, one with slope > 1."""
    fixed_points = theory.fixed_points
    slope = dyn.map_derivative(anchor="two_kl").logit_map_slope
    f = sp.lambdify((p_star, beta, eps, sp.Symbol("alpha", positive=True)), slope, "numpy")
    roots = fixed_points(0.001, 1.0, alpha=0.5, eps=1e-5)
    assert len(roots) == 3
    slopes = [f(x, 1.0, 1e-5, 0.5) for x in roots]
    assert max(abs(s) for s in slopes) > 1


def test_fixed_point_residual_vanishes_at_theory_roots():
    fixed_points = theory.fixed_points
    r = lambdify(dyn.fixed_point_equation())
    for pr, b in [(0.2, 0.5), (0.05, 2.0), (0.5, 10.0)]:
        roots = fixed_points(pr, b, eps=1e-4)
        for x in roots[roots < 1 - 1e-9]:
            assert r(x, pr, b, 1e-4, 1.0) == pytest.approx(0, abs=1e-10)


def test_sigmoid_derivative():
    eq = dyn.sigmoid_derivative()
    assert isinstance(eq, sp.Eq)
