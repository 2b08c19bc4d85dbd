"""One registry of per-sample KL estimators, read by the loss (torch) and the theory (numpy).

For every estimator registered in ``theory.kl_estimators.KL_ESTIMATORS``:

- the trainer's per-token penalty (``rl.losses.kl_penalty``, torch) equals the registry's
  formula evaluated with numpy, in value and in its gradient with respect to the policy's
  log-probabilities;
- its mean under the policy, by exact enumeration of a small tabular policy, is the true
  ``KL(pi || anchor)`` for an unbiased estimator, and the KL to second order (the error
  shrinks as the cube of the distance) for a biased one;

and an estimator registered with ``register_kl_estimator`` reaches both layers at once.
"""

import numpy as np
import pytest
import torch

from grpo_companion.rl import losses
from grpo_companion.theory import kl_estimators as kle

D = torch.float64


def _names():
    return tuple(kle.KL_ESTIMATORS)


def _log_probs(seed, shape=(4, 7), spread=2.0):
    """Three random log-probability tables: policy, anchor and sampler (rows sum to 1)."""
    rng = np.random.default_rng(seed)
    return tuple(np.log(rng.dirichlet(np.full(shape[-1], spread), size=shape[0]))
                 for _ in range(3))


def _numpy_value(est, lp, la, lo):
    """The registry's formula with numpy: value(d), times pi / pi_old when ratio-weighted."""
    value = est.value(la - lp, np)
    return np.exp(lp - lo) * value if est.ratio_weighted else value


def _numpy_gradient(est, lp, la, lo):
    """d(per-token value) / d(logp) from the registry's score.

    ``-value'(d)`` for a plain estimator and ``ratio (value - value')`` for a
    ratio-weighted one: the registry's ``score`` times the ratio (1 when plain).
    """
    score = est.score(la - lp, np) * np.ones_like(lp)
    return np.exp(lp - lo) * score if est.ratio_weighted else score


def _check_against_numpy(name, seed):
    est = kle.KL_ESTIMATORS[name]
    lp, la, lo = _log_probs(seed)
    la[0, :3] = lp[0, :3] + np.array([3.0, 20.0, 90.0])  # d well past 1: k3_ratio's far branch
    logp = torch.tensor(lp, dtype=D, requires_grad=True)
    got = losses.kl_penalty(logp, torch.tensor(la, dtype=D), name,
                            prev_logp=torch.tensor(lo, dtype=D))
    np.testing.assert_allclose(got.detach().numpy(), _numpy_value(est, lp, la, lo),
                               rtol=1e-12, atol=1e-14, err_msg=f"{name}: value")
    (grad,) = torch.autograd.grad(got.sum(), logp)
    np.testing.assert_allclose(grad.numpy(), _numpy_gradient(est, lp, la, lo), rtol=1e-10,
                               atol=1e-12, err_msg=f"{name}: gradient")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", _names())
def test_the_torch_loss_is_the_numpy_formula(name, seed):
    _check_against_numpy(name, seed)


def _mean_under(pi, ref, est, old=None):
    """E_{o ~ old}[k(o)] by enumeration (``old = pi``: on policy, ratio 1)."""
    old = pi if old is None else old
    return float(np.sum(old * _numpy_value(est, np.log(pi), np.log(ref), np.log(old))))


def _kl(p, q):
    return float(np.sum(p * np.log(p / q)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", _names())
def test_the_mean_under_pi_is_the_kl_or_its_second_order(name, seed):
    est = kle.KL_ESTIMATORS[name]
    rng = np.random.default_rng(100 + seed)
    pi, ref, old = (rng.dirichlet(np.ones(5)) for _ in range(3))
    if est.unbiased:
        assert _mean_under(pi, ref, est) == pytest.approx(_kl(pi, ref), rel=1e-12, abs=1e-15)
        if est.ratio_weighted:  # the importance ratio keeps it unbiased off policy too
            assert _mean_under(pi, ref, est, old) == pytest.approx(_kl(pi, ref), rel=1e-12)
        return
    # biased: E_pi[k] = KL + O(|d|^3). Along ref_t = pi exp(t h) / Z the error falls ~ t^3
    h = rng.normal(size=5)
    errors = []
    for t in (1e-2, 1e-3):
        ref_t = pi * np.exp(t * h)
        ref_t /= ref_t.sum()
        errors.append(abs(_mean_under(pi, ref_t, est) - _kl(pi, ref_t)))
    assert errors[1] < 2e-3 * errors[0] + 1e-18, errors  # a t^2 error would only fall 100x


# --- a new estimator is one registration ---------------------------------------------------


@pytest.fixture
def k1_ratio():
    """``(pi / pi_old) (-d)``: its mean under pi_old is KL(pi || anchor), exactly."""
    entry = kle.register_kl_estimator(
        "k1_ratio", lambda d, xp: -d, lambda d, xp: 1.0 - d, follows="forward",
        formula="(pi / pi_old) (-d)", summary="(pi / pi_old) (-d), follows grad KL(pi || anchor)",
        ratio_weighted=True)
    try:
        yield entry
    finally:
        kle.unregister_kl_estimator("k1_ratio")


def test_a_registered_estimator_reaches_the_loss_and_the_theory(k1_ratio):
    # the loss layer's names and choices, the trainer's help text
    assert "k1_ratio" in losses.KL_ESTIMATORS and "k1_ratio" in losses.KL_CHOICES
    assert losses.KL_CHOICES == ("exact", *kle.KL_ESTIMATORS)
    assert "k1_ratio: (pi / pi_old) (-d)" in kle.kl_estimator_help()
    assert kle.ESTIMATOR_TARGETS["k1_ratio"] == "forward"
    # the same checks as every built-in one
    for seed in range(2):
        _check_against_numpy("k1_ratio", seed)
    rng = np.random.default_rng(7)
    pi, ref, old = (rng.dirichlet(np.ones(4)) for _ in range(3))
    assert _mean_under(pi, ref, k1_ratio, old) == pytest.approx(_kl(pi, ref), rel=1e-12)
    # the theory: its expected gradient is the gradient of KL(pi || ref), as it claims
    forward = pi * (np.log(pi / ref) - _kl(pi, ref))
    np.testing.assert_allclose(kle.expected_kl_gradient(pi, ref, "k1_ratio", prev_policy=old),
                               forward, atol=1e-14)
    np.testing.assert_allclose(kle.logit_drift(0.4, 0.3, 0.5, "k1_ratio"),
                               kle.logit_drift(0.4, 0.3, 0.5, "k3_ratio"), rtol=1e-14)
    # and the whole loss takes it
    g = torch.Generator().manual_seed(0)
    logp, old_t, ref_t = (torch.log_softmax(torch.randn(3, 4, generator=g, dtype=D), 1)
                          for _ in range(3))
    loss = losses.grpo_loss(logp, old_t, ref_t, torch.randn(3, generator=g, dtype=D),
                            torch.ones(3, 4, dtype=D), beta=0.1, kl="k1_ratio")
    assert torch.isfinite(loss)


def test_unregistering_removes_it_from_both_layers(k1_ratio):
    kle.unregister_kl_estimator("k1_ratio")
    try:
        assert "k1_ratio" not in losses.KL_CHOICES and "k1_ratio" not in kle.ESTIMATOR_TARGETS
        with pytest.raises(ValueError, match="kl"):
            losses.kl_penalty(torch.zeros(2), torch.zeros(2), "k1_ratio", torch.zeros(2))
    finally:  # the fixture unregisters it again
        kle.register_kl_estimator("k1_ratio", k1_ratio.value, k1_ratio.score,
                                  follows="forward", formula=k1_ratio.formula,
                                  summary=k1_ratio.summary, ratio_weighted=True)


def _register(**changes):
    args = {"name": "k_new", "value": lambda d, xp: 0.5 * d * d, "score": lambda d, xp: -d,
            "follows": "forward", "formula": "d**2 / 2", "summary": "k2 again",
            "unbiased": False, **changes}
    try:
        return kle.register_kl_estimator(**args)
    finally:
        if "k_new" in kle.KL_ESTIMATORS:
            kle.unregister_kl_estimator("k_new")


@pytest.mark.parametrize(("changes", "named"), [
    ({"name": "k3"}, "already registered"),
    ({"name": "exact"}, "name"),
    ({"name": "not a name"}, "name"),
    ({"follows": "sideways"}, "follows"),
    ({"value": "d**2"}, "value"),
    ({"score": lambda d, xp: d}, "score"),  # the sign of the derivative is wrong
    ({"value": lambda d, xp: np.sqrt(d)}, "value"),  # not finite (NaN) for d < 0
    ({"unbiased": True}, "unbiased"),  # d**2 / 2 is not unbiased
    ({"stable": lambda lp, la, lo, xp: lp}, "stable"),  # only for ratio-weighted ones
])
def test_a_bad_registration_is_refused(changes, named):
    with pytest.raises(ValueError, match=named):
        _register(**changes)
    assert "k_new" not in kle.KL_ESTIMATORS and "k_new" not in kle.ESTIMATOR_TARGETS


def test_built_ins_cannot_be_removed():
    with pytest.raises(ValueError, match="built in"):
        kle.unregister_kl_estimator("k3_ratio")
    with pytest.raises(ValueError, match="not a registered"):
        kle.unregister_kl_estimator("k9")
