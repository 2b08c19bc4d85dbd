"""Two-KL GRPO: Lemma 2, Lemma 3 (Renyi correction), Theorem 9, Table 1."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from grpo_companion.symbolic import two_kl
from grpo_companion.symbolic.policy import pos_map
from grpo_companion.symbolic.symbols import alpha, lambdify


def renyi(a: np.ndarray, b: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(a**order * b ** (1 - order))) / (order - 1))


def grpo_omega(prob: float, eps: float) -> float:
    return 1.0 / np.sqrt(prob * (1 - prob) + eps)


def test_lemma2_symbolic_and_numeric():
    ident = two_kl.geometric_mean_identity(3)
    args = (*ident.policy[:-1], *ident.reference, *ident.other, alpha)
    f = sp.lambdify(args, ident.lhs - ident.rhs, "numpy")
    g = sp.lambdify(args, ident.constant - ident.constant_as_renyi, "numpy")
    rng = np.random.default_rng(0)
    for _ in range(50):
        pi, ref, oth = (rng.dirichlet(np.ones(3)) for _ in range(3))
        a = rng.uniform(0.05, 0.95)
        vals = (*pi[:-1], *ref, *oth, a)
        assert f(*vals) == pytest.approx(0, abs=1e-12)
        assert g(*vals) == pytest.approx(0, abs=1e-12)
        # the constant is (1 - alpha) D_alpha(ref||other) >= 0
        assert (1 - a) * renyi(ref, oth, a) >= -1e-15


def test_lemma3_numeric():
    lemma = two_kl.geometric_mean_pos(2, 3)
    anchor_logit = sp.lambdify((*lemma.reference, *lemma.prev, alpha), lemma.anchor_logit)
    rng = np.random.default_rng(1)
    for _ in range(50):
        ref, prev = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        a = rng.uniform(0.05, 0.95)
        geo = ref**a * prev ** (1 - a)
        direct = np.log(geo[:2].sum() / geo[2:].sum())
        d_s = renyi(ref[:2] / ref[:2].sum(), prev[:2] / prev[:2].sum(), a)
        d_f = renyi(ref[2:] / ref[2:].sum(), prev[2:] / prev[2:].sum(), a)
        lr, lp = np.log(ref[:2].sum() / ref[2:].sum()), np.log(prev[:2].sum() / prev[2:].sum())
        # Lemma 3 as printed: (alpha - 1)(D_S - D_F); Theorem 9: (1 - alpha)(D_F - D_S)
        assert direct == pytest.approx(a * lr + (1 - a) * lp + (a - 1) * (d_s - d_f), abs=1e-12)
        assert anchor_logit(*ref, *prev, a) == pytest.approx(direct, abs=1e-12)
    assert two_kl.lemma3_paper_sign_check() == 0


def test_theorem9_against_exact_tabular_iteration():
    """Iterate the exact two-KL optimum on 5 outcomes from pi_0 != pi_ref."""
    rng = np.random.default_rng(2)
    success = np.array([True, True, False, False, False])
    for _ in range(5):
        ref, pi = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        a, b, e = rng.uniform(0.1, 0.9), rng.uniform(0.5, 5.0), 1e-3
        for _step in range(6):
            prob = pi[success].sum()
            om = grpo_omega(prob, e)
            adv = np.where(success, (1 - prob) * om, -prob * om)
            new = ref**a * pi ** (1 - a) * np.exp(adv / b)
            new /= new.sum()
            d_s = renyi(ref[success] / ref[success].sum(), pi[success] / prob, a)
            d_f = renyi(ref[~success] / ref[~success].sum(), pi[~success] / (1 - prob), a)
            lref = np.log(ref[success].sum() / ref[~success].sum())
            predicted = a * lref + (1 - a) * np.log(prob / (1 - prob))
            predicted += (1 - a) * (d_f - d_s) + om / b
            assert np.log(new[success].sum() / new[~success].sum()) == pytest.approx(
                predicted, abs=1e-10
            )
            pi = new


def test_renyi_correction_vanishes_from_reference_start():
    inv = two_kl.conditional_invariance(2, 2)
    assert inv.renyi_success == 0 and inv.renyi_failure == 0
    assert inv.class_ratios[0] == inv.class_ratios[1]
    assert inv.class_ratios[2] == inv.class_ratios[3]
    # numerically: started at pi_ref, the exact iteration follows the Delta_R = 0 map
    f = lambdify(pos_map("mean_std", "sqrt", "two_kl").next_prob)
    rng = np.random.default_rng(3)
    success = np.array([True, False, True, False])
    ref = rng.dirichlet(np.ones(4))
    pi = ref.copy()
    a, b, e = 0.4, 3.0, 1e-2
    for _ in range(10):
        prob = pi[success].sum()
        om = grpo_omega(prob, e)
        new = ref**a * pi ** (1 - a) * np.exp(np.where(success, 1 - prob, -prob) * om / b)
        new /= new.sum()
        assert new[success].sum() == pytest.approx(f(prob, ref[success].sum(), b, e, a), rel=1e-10)
        np.testing.assert_allclose(new[success] / ref[success], (new / ref)[success][0], rtol=1e-12)
        pi = new


def test_two_kl_step_policy_is_tilted_geometric_mean():
    step = two_kl.two_kl_step(2, 2)
    assert step.recurrence.rhs.has(two_kl.delta_renyi)
    assert len(step.policy) == 4


def test_policy_fixed_point_is_reference_kl_at_alpha_beta():
    eq = two_kl.policy_fixed_point()
    assert eq.rhs.has(sp.exp(sp.Symbol("A", real=True) / (alpha * two_kl.beta)))


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="n_outcomes"):
        two_kl.geometric_mean_identity(1)
    with pytest.raises(ValueError, match="n_failure"):
        two_kl.geometric_mean_pos(1, 0)
