"""The moving reference (TRL's sync_ref_model) derived in SymPy against the numeric recurrence."""

import numpy as np
import pytest
import sympy as sp

from grpo_companion import theory
from grpo_companion.symbolic import symbols as sy
from grpo_companion.symbolic.two_kl import mixup, moving_reference, p_new_ref
from grpo_companion.theory.analyses.staged import moving_reference_iterate, staged_iterate

P_N = sp.Symbol("p_n", real=True)


def _numeric_maps(normalization="mean_std"):
    m = moving_reference(normalization=normalization)
    step = sp.lambdify((sy.p, sy.p_ref, sy.beta, sy.eps, sy.alpha), m.step.rhs, "numpy")
    sync = sp.lambdify((P_N, sy.p_ref, mixup), m.sync.rhs, "numpy")
    return step, sync


def _symbolic_path(p_ref, beta, n_steps, k, a, alpha, eps, normalization="mean_std"):
    step, sync = _numeric_maps(normalization)
    p, ref = np.asarray(p_ref, float), np.asarray(p_ref, float)
    out = [theory.logit(p)]
    for n in range(1, n_steps + 1):
        logit_n = step(p, ref, beta, eps, alpha)
        p = theory.sigmoid(logit_n)
        out.append(logit_n)
        if n % k == 0:
            ref = theory.sigmoid(sync(p, ref, a))
    return np.array(out)


@pytest.mark.parametrize(("k", "a", "alpha"), [(1, 0.2, 1.0), (3, 0.6, 1.0), (2, 0.3, 0.5),
                                               (2, 0.5, 1.0), (4, 1.0, 1.0), (2, 0.0, 0.7)])
def test_the_symbolic_recurrence_is_the_numeric_one(k, a, alpha) -> None:
    p_refs = np.array([0.05, 0.2, 0.5, 0.8])
    derived = _symbolic_path(p_refs, 5.0, 10, k, a, alpha, 1e-5)
    numeric = moving_reference_iterate(p_refs, 5.0, 10, k, a, alpha=alpha, eps=1e-5)
    np.testing.assert_allclose(derived, numeric.logit_p, rtol=1e-11, atol=1e-11)


def test_mean_only_calibration_too() -> None:
    derived = _symbolic_path(np.array([0.1, 0.4]), 1.0, 6, 2, 0.5, 1.0, 1e-5, "mean_only")
    numeric = moving_reference_iterate([0.1, 0.4], 1.0, 6, 2, 0.5, normalization="mean_only",
                                       eps=1e-5)
    np.testing.assert_allclose(derived, numeric.logit_p, rtol=1e-11, atol=1e-11)


def test_mixup_one_is_staged_grpo_and_zero_is_the_plain_recurrence() -> None:
    m = moving_reference()
    assert sp.simplify(m.sync.rhs.subs(mixup, 1) - sy.logit(P_N)) == 0
    assert sp.simplify(m.sync.rhs.subs(mixup, 0) - sy.logit(sy.p_ref)) == 0
    assert m.sync.lhs == sy.logit(p_new_ref)
    p_refs = np.array([0.05, 0.3])
    np.testing.assert_allclose(_symbolic_path(p_refs, 2.0, 6, 3, 1.0, 1.0, 1e-5),
                               staged_iterate(p_refs, 2.0, 6, 3, eps=1e-5).logit_p, atol=1e-11)
    np.testing.assert_allclose(
        _symbolic_path(p_refs, 2.0, 6, 3, 0.0, 1.0, 1e-5),
        theory.iterate_logit(theory.logit(p_refs), theory.logit(p_refs), 2.0, 6, eps=1e-5),
        atol=1e-11)


@pytest.mark.parametrize(("n_success", "n_failure"), [(1, 1), (2, 2), (1, 3), (3, 2)])
def test_the_general_sync_is_lemma3_and_reduces_for_proportional_policies(n_success,
                                                                         n_failure) -> None:
    m = moving_reference(n_success, n_failure)
    n = n_success + n_failure
    pis = sp.symbols(f"pi1:{n + 1}", positive=True)
    refs = sp.symbols(f"r1:{n + 1}", positive=True)
    f = sp.lambdify((*pis, *refs, mixup), m.general_sync, "numpy")
    rng = np.random.default_rng(0)
    for _ in range(5):
        pi, ref, a = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n)), rng.uniform(0.05, 0.95)
        mixed = pi**a * ref ** (1 - a)
        direct = np.log(mixed[:n_success].sum()) - np.log(mixed[n_success:].sum())
        assert abs(f(*pi, *ref, a) - direct) < 1e-10
        # class-proportional pi: the correction vanishes, sync holds
        prop = ref * np.where(np.arange(n) < n_success, 2.0, 0.5)
        prop /= prop.sum()
        lp = np.log(prop[:n_success].sum() / prop[n_success:].sum())
        lr = np.log(ref[:n_success].sum() / ref[n_success:].sum())
        assert abs(f(*prop, *ref, a) - (a * lp + (1 - a) * lr)) < 1e-10
    assert sp.simplify(sum(m.mixed_probs) - 1) == 0


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="n_success"):
        moving_reference(0, 2)
    with pytest.raises(ValueError, match="n_failure"):
        moving_reference(1, 4)
