"""Optimal policies from Lagrange conditions and PoS maps (Theorems 1, 2, 4, 8; Prop. 1)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from grpo_companion import theory
from grpo_companion.symbolic import policy as pol
from grpo_companion.symbolic.contrastive import w_minus_sym, w_plus_sym
from grpo_companion.symbolic.symbols import LAMBDA_ARGS, beta, lambdify, logit, p, p_ref

RTOL = 1e-10


def random_params(n: int = 200, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "p": rng.uniform(0.01, 0.99, n),
        "p_ref": rng.uniform(0.01, 0.99, n),
        "beta": 10 ** rng.uniform(-1, 1, n),
        "eps": 10 ** rng.uniform(-6, -1, n),
        "alpha": rng.uniform(0.05, 0.95, n),
    }


def test_lagrange_solution_structure():
    sol = pol.optimal_policy(2, 2)
    assert sol.hessian_diagonal == tuple(-beta / x for x in sp.symbols("pi1:5", positive=True))
    assert sol.logit_step.rhs == logit(pol.p_anchor) + (w_plus_sym + w_minus_sym) / beta


def _maximise_on_simplex(adv, anchor, b, iterations=60):
    """Damped Newton ascent of J(q) = q.A - b KL(q||anchor) over the open simplex.

    The last coordinate is eliminated (q_K = 1 - sum of the others), and the step uses
    J's own gradient and Hessian, not the Gibbs form. Returns q and the KKT residual:
    the spread over i of g_i = A_i - b (log(q_i / anchor_i) + 1), which is constant at
    the maximum.
    """
    def value(q):
        return q @ adv - b * np.sum(q * np.log(q / anchor))

    q = np.full(len(adv), 1.0 / len(adv))
    for _ in range(iterations):
        g = adv - b * (np.log(q / anchor) + 1.0)
        grad = g[:-1] - g[-1]
        hess = -b * (np.diag(1.0 / q[:-1]) + 1.0 / q[-1])
        step = np.linalg.solve(hess, -grad)
        full = np.append(step, -step.sum())
        t = 1.0
        # shrink while the step leaves the simplex or lowers J by more than J's own rounding
        while np.any(q + t * full <= 0) or value(q + t * full) < value(q) - 1e-14:
            t /= 2
            if t < 1e-12:
                break
        q = q + t * full
    g = adv - b * (np.log(q / anchor) + 1.0)
    return q, float(g.max() - g.min())


def test_lagrange_solution_matches_numeric_optimisation():
    """Closed form vs direct maximisation of E_pi[A] - beta KL(pi||anchor) on the simplex.

    Tolerance from the reference's KKT residual r: if g_i = c + e_i with e_i in an interval
    of width r, then q_i / q*_i = exp(-e_i/beta) / sum_j q*_j exp(-e_j/beta), so every
    relative error is at most expm1(r / beta); 1e-12 more covers SymPy's float evaluation.
    (BFGS in softmax logits stopped 22 % away on probabilities of 1e-5 on another CPU:
    the logit gradient scales with q, so a small gradient there is not convergence.)
    """
    sol = pol.optimal_policy(2, 2)
    rng = np.random.default_rng(3)
    for _ in range(5):
        anchor = rng.dirichlet(np.ones(4))
        w_p, w_m, b = rng.uniform(0.1, 3.0), rng.uniform(0.1, 3.0), rng.uniform(0.3, 3.0)
        adv = np.array([w_p, w_p, -w_m, -w_m])
        q, residual = _maximise_on_simplex(adv, anchor, b)
        assert residual / b < 1e-10, f"the reference did not converge: KKT residual {residual}"
        subs = {w_plus_sym: w_p, w_minus_sym: w_m, beta: b}
        subs.update(dict(zip(sol.anchor, anchor, strict=True)))
        z = float(sol.partition.subs(subs).subs(pol.p_anchor, anchor[:2].sum()))
        closed = [float(e.subs(subs).subs(sp.Symbol("Z", positive=True), z)) for e in sol.policy]
        np.testing.assert_allclose(q, closed, rtol=np.expm1(residual / b) + 1e-12, atol=0)


@pytest.mark.parametrize("anchor", ["reference", "mirror", "two_kl"])
@pytest.mark.parametrize(("normalization", "placement"),
                         [("mean_std", "sqrt"), ("mean_std", "std"), ("mean_only", "sqrt")])
def test_pos_map_matches_theory(anchor, normalization, placement):
    pos_map = theory.pos_map
    expr = pol.pos_map(normalization, placement, anchor).next_prob
    f = lambdify(expr)
    prm = random_params()
    alpha_value = {"reference": np.ones(200), "mirror": np.zeros(200)}.get(anchor, prm["alpha"])
    ours = f(prm["p"], prm["p_ref"], prm["beta"], prm["eps"], alpha_value)
    for i in range(200):
        theirs = pos_map(prm["p"][i], prm["p_ref"][i], prm["beta"][i], alpha=alpha_value[i],
                         eps=prm["eps"][i], normalization=normalization, eps_placement=placement)
        assert float(theirs) == pytest.approx(ours[i], rel=RTOL)


def test_partition_is_consistent_with_map():
    """p_n = p_anchor exp(w+/beta) / Z for the reference anchor (Theorem 1)."""
    m = pol.pos_map("mean_std", "sqrt", "reference")
    from grpo_companion.symbolic.calibration import calibration_weights

    w = calibration_weights()
    from_z = p_ref * sp.exp(w.w_plus / beta) / m.partition
    f, g = lambdify(from_z), lambdify(m.next_prob)
    prm = random_params()
    args = (prm["p"], prm["p_ref"], prm["beta"], prm["eps"], prm["alpha"])
    np.testing.assert_allclose(f(*args), g(*args), rtol=RTOL)


def test_theorem2_form():
    eq = pol.theorem2_map()
    f = sp.lambdify(LAMBDA_ARGS, eq.lhs - eq.rhs, "numpy")
    prm = random_params()
    np.testing.assert_allclose(f(*prm.values()), 0, atol=1e-12)


def test_mirror_logit_form():
    from grpo_companion.symbolic.calibration import calibration_weights

    m = pol.pos_map(anchor="mirror")
    assert sp.simplify(m.logit_form.rhs - logit(p) - calibration_weights().omega / beta) == 0
    assert not m.logit_form.rhs.has(p_ref)


def test_bad_anchor_and_sizes_raise():
    with pytest.raises(ValueError, match="anchor"):
        pol.pos_map(anchor="both")
    with pytest.raises(ValueError, match="n_success"):
        pol.optimal_policy(0, 2)
