"""Exact GRPO surrogate and its contrastive form against brute-force per-outcome formulas."""

import math

import numpy as np
import pytest

from grpo_companion import theory
from grpo_companion.theory.analyses import surrogate as sg


def _problem(seed, n=9, spread=0.5):
    rng = np.random.default_rng(seed)
    old = rng.dirichlet(np.ones(n))
    pi = old * np.exp(spread * rng.standard_normal(n))
    mask = np.zeros(n, dtype=bool)
    mask[rng.choice(n, size=rng.integers(1, n), replace=False)] = True
    return pi / pi.sum(), old, mask


def _brute_force(pi, old, mask, clip_eps, cal):
    """Loop over outcomes with the PPO formula written out by cases."""
    p = sum(q for q, m in zip(old, mask, strict=True) if m)
    w_plus, w_minus = (float(w) for w in cal.weights(p))
    total = 0.0
    for q, new, m in zip(old, pi, mask, strict=True):
        x = new / q
        a = w_plus if m else -w_minus
        if clip_eps is None:
            total += q * x * a
        else:
            clipped = min(max(x, 1 - clip_eps), 1 + clip_eps)
            total += q * min(x * a, clipped * a)
    return total, p, w_plus, w_minus


CALS = [theory.Calibration(eps=1e-5), theory.Calibration(eps=0.0),
        theory.Calibration(normalization="mean_only"),
        theory.Calibration(eps=1e-4, eps_placement="std")]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("clip_eps", [0.0, 0.1, 0.2, 1.5, None])
@pytest.mark.parametrize("cal", CALS)
def test_surrogate_and_contrastive_form_match_brute_force(seed, clip_eps, cal):
    pi, old, mask = _problem(seed)
    expected, _, _, _ = _brute_force(pi, old, mask, clip_eps, cal)
    got = sg.surrogate(pi, old, mask, clip_eps=clip_eps, calibration=cal)
    contrastive = sg.contrastive_form(pi, old, mask, clip_eps=clip_eps, calibration=cal)
    assert got == pytest.approx(expected, abs=1e-13)
    assert contrastive == pytest.approx(expected, abs=1e-13)


@pytest.mark.parametrize("seed", range(4))
def test_no_clip_limit_is_eq5(seed):
    pi, old, mask = _problem(seed)
    p = old[mask].sum()
    w_plus, w_minus = theory.weights(p, eps=1e-5)
    eq5 = w_plus * pi[mask].sum() - w_minus * pi[~mask].sum()
    for c in (None, math.inf, 1e6):  # a huge clip range never binds on these ratios
        assert sg.surrogate(pi, old, mask, clip_eps=c, eps=1e-5) == pytest.approx(eq5, abs=1e-13)
    terms = sg.contrastive_terms(pi, old, mask, eps=1e-5)
    np.testing.assert_allclose([terms.success_term, terms.failure_term],
                               [pi[mask].sum(), pi[~mask].sum()], atol=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_clipping_only_lowers_the_objective_and_vanishes_at_old_policy(seed):
    pi, old, mask = _problem(seed, spread=1.0)
    clipped = sg.surrogate(pi, old, mask, clip_eps=0.2)
    unclipped = sg.surrogate(pi, old, mask)
    assert clipped <= unclipped + 1e-15
    # at pi = pi_old every ratio is 1 and E_old[A] = p w+ - (1-p) w- = 0 (balance)
    assert abs(sg.surrogate(old, old, mask, clip_eps=0.2)) < 1e-14


def test_conditional_reading_drops_event_masses():
    pi, old, mask = _problem(3)
    terms = sg.contrastive_terms(pi, old, mask, clip_eps=0.2, eps=0.0)
    p = old[mask].sum()
    x = pi / old
    cond_s = np.sum(old[mask] * np.minimum(x[mask], 1.2)) / p
    cond_f = np.sum(old[~mask] * np.maximum(x[~mask], 0.8)) / (1 - p)
    w_plus, w_minus = math.sqrt((1 - p) / p), math.sqrt(p / (1 - p))
    assert terms.conditional_value == pytest.approx(w_plus * cond_s - w_minus * cond_f, rel=1e-12)
    assert terms.value == pytest.approx(p * w_plus * cond_s - (1 - p) * w_minus * cond_f,
                                        rel=1e-12)
    assert abs(terms.conditional_value - terms.value) > 1e-3


def test_batched_policies():
    pis, olds, masks = zip(*(_problem(s) for s in range(3)), strict=True)
    mask = masks[0]
    got = sg.surrogate(np.stack(pis), np.stack(olds), mask, clip_eps=0.2)
    want = [sg.surrogate(p, o, mask, clip_eps=0.2) for p, o in zip(pis, olds, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-14)


def test_zero_old_mass_outcomes_are_ignored():
    old = np.array([0.5, 0.0, 0.3, 0.2])
    pi = np.array([0.4, 0.0, 0.4, 0.2])
    mask = np.array([1, 1, 0, 0])
    value = sg.surrogate(pi, old, mask, clip_eps=0.2, eps=0.0)
    expected, *_ = _brute_force(pi[[0, 2, 3]], old[[0, 2, 3]], mask[[0, 2, 3]], 0.2,
                                theory.Calibration(eps=0.0))
    assert value == pytest.approx(expected, abs=1e-14)


@pytest.mark.parametrize("clip_eps", [0.2, None])
@pytest.mark.parametrize("seed", range(3))
def test_monte_carlo_is_unbiased_with_correct_stderr(clip_eps, seed):
    pi, old, mask = _problem(seed, spread=0.8)
    exact = sg.surrogate(pi, old, mask, clip_eps=clip_eps)
    est = sg.monte_carlo_surrogate(pi, old, mask, 40_000, rng=seed, clip_eps=clip_eps)
    assert abs(est.mean - exact) < 4.5 * est.stderr
    # the standard error is the exact per-sample standard deviation over sqrt(n)
    x = pi / old
    p = old[mask].sum()
    w_plus, w_minus = theory.weights(p, eps=1e-5)
    values = sg.clipped_objective(x, np.where(mask, w_plus, -w_minus), clip_eps)
    mean = old @ values
    sd = math.sqrt(old @ (values - mean) ** 2)
    # the sample sd of n draws has relative standard error sqrt((kurtosis - 1) / (4 n))
    # (delta method on the sample variance); allow 5 of those
    kurtosis = (old @ (values - mean) ** 4) / sd**4
    rel = 5 * math.sqrt((kurtosis - 1) / (4 * 40_000))
    ratio = est.stderr / (sd / math.sqrt(40_000))
    assert abs(ratio - 1) <= rel, f"stderr / exact = {ratio:.4f}, allowed 1 +- {rel:.4f}"


def test_clipped_objective_by_sign():
    x = np.linspace(0.0, 3.0, 301)
    np.testing.assert_allclose(sg.clipped_objective(x, 2.0, 0.2), 2.0 * np.minimum(x, 1.2))
    np.testing.assert_allclose(sg.clipped_objective(x, -0.5, 0.2), -0.5 * np.maximum(x, 0.8))


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "wide"])
def test_clip_eps_validation(bad):
    pi, old, mask = _problem(0)
    with pytest.raises(ValueError, match="clip_eps"):
        sg.surrogate(pi, old, mask, clip_eps=bad)


def test_input_validation():
    pi, old, mask = _problem(0)
    with pytest.raises(ValueError, match="absolutely continuous"):
        sg.surrogate([0.5, 0.5], [1.0, 0.0], [1, 0])
    with pytest.raises(ValueError, match="n_samples"):
        sg.monte_carlo_surrogate(pi, old, mask, 1)
    with pytest.raises(ValueError, match="ratio"):
        sg.clipped_objective(-1.0, 1.0, 0.2)
    with pytest.raises(ValueError, match="prev_policy"):
        sg.surrogate(pi, old * 2, mask)
    with pytest.raises(ValueError, match="success_mask"):
        sg.surrogate(pi, old, np.full(pi.size, 2))
    with pytest.raises(ValueError, match="1-D"):
        sg.monte_carlo_surrogate(np.stack([pi, pi]), np.stack([old, old]), mask, 10)
