"""Every registered calibration, through every layer: one test a new registration gets for free.

A calibration is defined once, by its ``gains(succ, fail, n, cal, ops)``
function in :mod:`grpo_companion.theory.normalizations`. Each check below
compares two routes from that definition that could disagree:

- **population vs groups**: the population weights (the ``n=None`` branch)
  must be the large-group limit of the exact finite-group weights (the ``n``
  branch, summed over Bin(G, p)), found by Richardson extrapolation;
- **SymPy vs numpy**: the symbolic weights and finite-group weights, and
  ``Omega'`` against a central difference of ``Omega``;
- **Monte Carlo**: sampled Bernoulli groups through the numpy and the torch
  group advantages (identical), whose conditional means estimate the exact
  finite-group weights within 5 standard errors;
- **direct formulas** (built-ins): the advantages against an independent
  line of numpy written from each method's own definition (``(r - mean) /
  std``, leave-one-out, ...);
- **training**: exact-mode training with ``TrainConfig.variant`` follows the
  theory's recurrence for that variant, under each anchor.

``test_a_wrong_registration_is_caught`` registers broken calibrations and
shows that these checks fail on them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy as sp
import torch

from grpo_companion import theory
from grpo_companion.rl import losses
from grpo_companion.rl.trainer import TrainConfig, train
from grpo_companion.symbolic import calibration as symbolic
from grpo_companion.symbolic.symbols import eps as eps_symbol
from grpo_companion.symbolic.symbols import p as p_symbol
from grpo_companion.theory.normalizations import NORMALIZATIONS

P_CHECK = np.array([0.12, 0.3, 0.41, 0.66, 0.87])  # away from max_abs's kink at 1/2


def calibrations() -> list[theory.Calibration]:
    """Every registered normalisation, with each option it uses."""
    out = []
    for name, entry in NORMALIZATIONS.items():
        if entry.uses_eps:
            out += [theory.Calibration(name, eps=1e-3, eps_placement="sqrt", ddof=0),
                    theory.Calibration(name, eps=1e-4, eps_placement="std", ddof=1)]
        else:
            out.append(theory.Calibration(name))
    return out


def ids(cal: theory.Calibration) -> str:
    return f"{cal.normalization}-{cal.eps_placement}-ddof{cal.ddof}"


CALS = calibrations()


# ---------------------------------------------------------------- the checks
def check_population_is_large_group_limit(cal: theory.Calibration) -> None:
    pop = np.array(cal.weights(P_CHECK))
    big = {g: np.array(dataclasses.replace(cal, group_size=g).weights(P_CHECK))
           for g in (800, 1600)}
    richardson = 2 * big[1600] - big[800]  # cancels the 1/G term
    np.testing.assert_allclose(richardson, pop, rtol=2e-4, atol=1e-6,
                               err_msg=f"{ids(cal)}: population weights are not the G -> inf "
                                       "limit of the finite-group weights")


def check_symbolic_matches_numeric(cal: theory.Calibration) -> None:
    w = symbolic.calibration_weights(cal)
    f = sp.lambdify((p_symbol, eps_symbol), (w.w_plus, w.w_minus, w.omega), "numpy")
    got = [np.broadcast_to(x, P_CHECK.shape) for x in f(P_CHECK, cal.eps)]
    w_plus, w_minus = cal.weights(P_CHECK)
    np.testing.assert_allclose(got, [w_plus, w_minus, cal.omega(P_CHECK)], rtol=1e-10,
                               err_msg=f"{ids(cal)}: SymPy and numpy weights differ")
    g = symbolic.group_weights(4, cal)
    fg = sp.lambdify((p_symbol, eps_symbol), (g.w_plus, g.w_minus), "numpy")
    want = dataclasses.replace(cal, group_size=4).weights(P_CHECK)
    np.testing.assert_allclose([np.broadcast_to(x, P_CHECK.shape) for x in fg(P_CHECK, cal.eps)],
                               want, rtol=1e-10, atol=1e-14,
                               err_msg=f"{ids(cal)}: 2^G enumeration and Bernstein sum differ")


def check_omega_prime(cal: theory.Calibration) -> None:
    lp = theory.logit(P_CHECK)
    h = 1e-6
    fd = (cal.omega_of_logit(lp + h) - cal.omega_of_logit(lp - h)) / (2 * h)
    np.testing.assert_allclose(cal.omega_prime_of_logit(lp), fd, rtol=1e-6, atol=1e-8,
                               err_msg=f"{ids(cal)}: Omega' is not the derivative of Omega")


def check_monte_carlo(cal: theory.Calibration, group_size: int = 6,
                      n_groups: int = 40_000) -> None:
    rng = np.random.default_rng(7)
    exact = np.array(dataclasses.replace(cal, group_size=group_size).weights(P_CHECK))
    for j, p in enumerate(P_CHECK):
        rewards = (rng.random((n_groups, group_size)) < p).astype(np.float64)
        adv = theory.group_advantages(rewards, cal)
        adv_torch = losses.group_advantages(torch.from_numpy(rewards), cal).numpy()
        np.testing.assert_array_equal(adv, adv_torch, err_msg=f"{ids(cal)}: numpy != torch")
        for sign, (mask, target) in enumerate(((rewards == 1, exact[0, j]),
                                               (rewards == 0, exact[1, j]))):
            # group totals are i.i.d. across groups: ratio estimator with a delta-method s.e.
            x = np.where(mask, adv, 0.0).sum(1) * (1 if sign == 0 else -1)
            y = mask.sum(1).astype(np.float64)
            est = x.mean() / y.mean()
            se = np.std(x - est * y, ddof=1) / np.sqrt(n_groups) / y.mean()
            assert abs(est - target) <= 5 * se + 1e-12, (
                f"{ids(cal)}: Monte Carlo E[|A| | r={1 - sign}] = {est:.5f} +- {se:.1e} at "
                f"p={p} but the exact finite-group weight is {target:.5f}")


def _direct(cal: theory.Calibration, r: np.ndarray) -> np.ndarray | None:
    """Each built-in method written from its own definition, independently of ``gains``."""
    mean = r.mean(axis=-1, keepdims=True)
    centred = r - mean
    if cal.normalization == "mean_std":
        sd = r.std(axis=-1, ddof=cal.ddof, keepdims=True)
        scale = np.sqrt(sd**2 + cal.eps) if cal.eps_placement == "sqrt" else sd + cal.eps
        out = centred / scale
    elif cal.normalization == "mean_only":
        out = centred
    elif cal.normalization == "rloo":
        g = r.shape[-1]
        others = (r.sum(axis=-1, keepdims=True) - r) / (g - 1)
        out = r - others
    elif cal.normalization == "max_abs":
        with np.errstate(invalid="ignore", divide="ignore"):
            out = centred / np.abs(centred).max(axis=-1, keepdims=True)
    else:
        return None
    return np.where(np.ptp(r, axis=-1, keepdims=True) == 0, 0.0, out)


def check_direct_formula(cal: theory.Calibration) -> None:
    rng = np.random.default_rng(3)
    r = (rng.random((500, 7)) < rng.random((500, 1))).astype(np.float64)
    want = _direct(cal, r)
    if want is None:
        pytest.skip(f"{cal.normalization} has no independent formula in this test")
    np.testing.assert_allclose(theory.group_advantages(r, cal), want, rtol=1e-12, atol=1e-12,
                               err_msg=f"{ids(cal)}: advantages differ from the method's "
                                       "own definition")


def check_exact_training(cal: theory.Calibration, anchor: theory.Anchor) -> None:
    variant = theory.Variant(cal, anchor)
    config = TrainConfig.flat(exact=True, n_prompts=24, n_outputs=10, n_success=3, iterations=4,
                              beta=1.5, seed=5, progress=False, p_ref_zero_fraction=0.15,
                              normalization=cal.normalization, eps=cal.eps,
                              eps_placement=cal.eps_placement, ddof=cal.ddof, alpha=anchor.alpha)
    assert config.variant == variant
    result = train(config)
    expected = theory.iterate(result.p_ref, result.p_ref, config.grpo.beta, config.run.iterations,
                              alpha=anchor.alpha, calibration=config.calibration)
    np.testing.assert_allclose(result.success_prob, expected, rtol=0, atol=1e-6,
                               err_msg=f"{ids(cal)} {anchor.kind}: exact training is not the "
                                       "theory's recurrence")


# ----------------------------------------------------------------- the tests
@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_population_is_the_large_group_limit(cal):
    check_population_is_large_group_limit(cal)


@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_symbolic_layer_matches_theory(cal):
    check_symbolic_matches_numeric(cal)


@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_omega_prime_is_the_derivative(cal):
    check_omega_prime(cal)


@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_monte_carlo_group_advantages_match_exact_weights(cal):
    check_monte_carlo(cal)


@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_advantages_match_each_methods_definition(cal):
    check_direct_formula(cal)


@pytest.mark.parametrize("anchor", [theory.Anchor.reference(), theory.Anchor.mirror(),
                                    theory.Anchor.two_kl(0.4)], ids=lambda a: a.kind)
@pytest.mark.parametrize("cal", CALS, ids=ids)
def test_exact_training_follows_the_variants_recurrence(cal, anchor):
    check_exact_training(cal, anchor)


def test_named_calibrations_are_registered_variants():
    assert set(theory.CALIBRATIONS) == {"paper", "trl", "mean_only", "rloo", "max_abs"}
    assert {c.normalization for c in theory.CALIBRATIONS.values()} <= set(NORMALIZATIONS)
    assert theory.CALIBRATIONS["trl"] == theory.Calibration("mean_std", 1e-4, "std", None, 1)


# ------------------------------------------------- broken registrations fail
def _half_whitened(succ, fail, n, cal, ops):
    """The review's bug, as a registration: groups centre only, the population whitens."""
    if n is None:
        s = ops.sqrt(succ * fail + cal.eps)
        return fail / s, succ / s
    return fail, succ


def _numpy_only(succ, fail, n, cal, ops):
    """Ignores ``ops``: works on numpy, cannot be derived symbolically."""
    top = np.maximum(succ, fail)
    return fail / top, succ / top


@pytest.mark.parametrize(("gains", "check"), [
    (_half_whitened, check_population_is_large_group_limit),
])
def test_a_wrong_registration_is_caught(gains, check):
    theory.register_normalization("broken_for_test", gains, summary="deliberately wrong",
                                  uses_eps=True)
    try:
        with pytest.raises((AssertionError, TypeError)):
            check(theory.Calibration("broken_for_test", eps=1e-3))
    finally:
        theory.unregister_normalization("broken_for_test")


def _batch_std(succ, fail, n, cal, ops):
    """Divides by the spread over the whole batch: not a per-prompt normalisation."""
    spread = np.std(np.asarray(succ)) + 0.5
    return fail / spread, succ / spread


@pytest.mark.parametrize(("gains", "message"), [
    (_batch_std, "depends on the other groups"),
    (lambda succ, fail, n, cal, ops: (-fail, succ), "must be >= 0"),
    (lambda succ, fail, n, cal, ops: (fail / 0 * succ, succ), "finite"),
    (lambda succ, fail, n, cal, ops: 1 / 0, "failed on numpy arrays"),
    (_numpy_only, "failed on SymPy symbols.*use ops.sqrt and ops.maximum"),
])
def test_registry_refuses_what_the_theory_cannot_use(gains, message):
    with np.errstate(divide="ignore", invalid="ignore"), pytest.raises(ValueError,
                                                                        match=message):
        theory.register_normalization("refused_for_test", gains, summary="x")
    assert "refused_for_test" not in NORMALIZATIONS


def test_registry_protects_names():
    with pytest.raises(ValueError, match="already registered"):
        theory.register_normalization("mean_std", _half_whitened, summary="x")
    with pytest.raises(ValueError, match="built in"):
        theory.unregister_normalization("rloo")
    with pytest.raises(ValueError, match="identifier"):
        theory.register_normalization("not a name", _half_whitened, summary="x")


def test_a_registered_normalization_reaches_the_trainer():
    theory.register_normalization("tripled_for_test", lambda s, f, n, cal, ops: (3 * f, 3 * s),
                                  summary="three times mean-only")
    try:
        cal = theory.Calibration("tripled_for_test")
        assert cal.omega(0.3) == pytest.approx(3.0)
        check_exact_training(cal, theory.Anchor.reference())
        config = TrainConfig.flat(normalization="tripled_for_test", iterations=1, n_prompts=8,
                                  group_size=4, progress=False)
        assert train(config).success_prob.shape == (2, 8)
    finally:
        theory.unregister_normalization("tripled_for_test")
