"""GRPO losses against hand-derived formulas and exact expectations."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_companion import theory
from grpo_companion.rl import losses

D = torch.float64


def _np_adv(r, mode, eps, ddof):
    r = np.asarray(r, dtype=float)
    mean = r.mean()
    if np.all(r == r[0]):
        return np.zeros_like(r)
    var = ((r - mean) ** 2).sum() / (len(r) - ddof)
    if mode == "paper":
        return (r - mean) / math.sqrt(var + eps)
    if mode == "trl":
        return (r - mean) / (math.sqrt(var) + eps)
    return r - mean


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=2, max_size=12))
def test_group_advantages_match_formulas(bits):
    r = torch.tensor([bits], dtype=D)
    paper = losses.group_advantages(r, normalization="mean_std", eps=1e-5, eps_placement="sqrt",
                                    ddof=0)
    trl = losses.group_advantages(r, theory.CALIBRATIONS["trl"])  # Bessel std + 1e-4
    mean_only = losses.group_advantages(r, normalization="mean_only")
    np.testing.assert_allclose(paper[0].numpy(), _np_adv(bits, "paper", 1e-5, 0), atol=1e-12)
    np.testing.assert_allclose(trl[0].numpy(), _np_adv(bits, "trl", 1e-4, 1), atol=1e-12)
    np.testing.assert_allclose(mean_only[0].numpy(), _np_adv(bits, "mean", 0, 0), atol=1e-12)


def test_paper_advantage_is_eq4_weights():
    # One success among G=4 (p-hat = 1/4): eq. (4) gives +(1-p)/sqrt(p(1-p)+eps), -p/sqrt(..).
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=D)
    adv = losses.group_advantages(r, eps=1e-5, eps_placement="sqrt", ddof=0)
    sd = math.sqrt(0.25 * 0.75 + 1e-5)
    np.testing.assert_allclose(adv[0].numpy(), [0.75 / sd] + [-0.25 / sd] * 3, rtol=1e-14)


@pytest.mark.parametrize("eps", [0.0, 1e-4])
@pytest.mark.parametrize("placement", ["sqrt", "std"])
def test_equal_rewards_give_zero_advantage(eps, placement):
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=D)
    adv = losses.group_advantages(r, eps=eps, eps_placement=placement)
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("bad", [0.3, -1.0, 2.0, float("nan")])
def test_group_advantages_need_verifiable_rewards(bad):
    # the advantage is derived from (k, G) of 0/1 rewards; anything else is refused by name
    r = torch.tensor([[1.0, 0.0, bad]], dtype=D)
    with pytest.raises(ValueError, match="rewards must each be 0 or 1"):
        losses.group_advantages(r)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"normalization": "z"}, "normalization"), ({"eps": -1.0}, "eps"),
    ({"eps_placement": "x"}, "eps_placement"), ({"ddof": 2}, "ddof"),
])
def test_group_advantages_reject_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        losses.group_advantages(torch.zeros(2, 3), **kwargs)


def test_clip_acts_by_sign_of_advantage():
    ratio = torch.tensor([0.5, 0.9, 1.1, 1.5, 0.5, 0.9, 1.1, 1.5], dtype=D)
    adv = torch.tensor([1.0] * 4 + [-1.0] * 4, dtype=D)
    logp = torch.log(ratio).reshape(-1, 1).requires_grad_(True)
    old = torch.zeros_like(logp)
    loss, clipped = losses.per_token_loss(logp, old, None, adv, clip_eps_low=0.2,
                                          clip_eps_high=0.28)
    # A > 0: -min(r, 1.28) * A ; A < 0: -max(r, 0.8) * A
    expected = [-min(r, 1.28) if a > 0 else max(r, 0.8) for r, a in zip(
        ratio.tolist(), adv.tolist(), strict=True)]
    np.testing.assert_allclose(loss[:, 0].detach().numpy(), expected, rtol=1e-14)
    assert clipped[:, 0].tolist() == [False, False, False, True, True, False, False, False]
    loss.sum().backward()
    grad = logp.grad[:, 0].numpy()
    assert np.all(grad[clipped[:, 0].numpy()] == 0)
    unclipped = ~clipped[:, 0].numpy()
    np.testing.assert_allclose(grad[unclipped], -(ratio * adv).numpy()[unclipped], rtol=1e-14)


@pytest.mark.parametrize("off", [None, math.inf])
def test_no_clipping(off):
    logp = torch.log(torch.tensor([[3.0], [0.1]], dtype=D))
    adv = torch.tensor([2.0, -1.0], dtype=D)
    loss, clipped = losses.per_token_loss(logp, torch.zeros_like(logp), None, adv,
                                          clip_eps_low=off)
    np.testing.assert_allclose(loss[:, 0].numpy(), [-6.0, 0.1], rtol=1e-14)
    assert not clipped.any()


def _batch(seed=0, batch=6, tokens=5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, tokens, generator=g, dtype=D) * 2
    old = logp + 0.3 * torch.randn(batch, tokens, generator=g, dtype=D)
    ref = logp + 0.3 * torch.randn(batch, tokens, generator=g, dtype=D)
    adv = torch.randn(batch, generator=g, dtype=D)
    lengths = torch.tensor([5, 1, 3, 5, 2, 4])[:batch]
    mask = torch.arange(tokens)[None, :] < lengths[:, None]
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("loss_type", losses.LOSS_TYPES)
def test_aggregation_matches_trl_definitions(loss_type):
    logp, old, ref, adv, mask = _batch()
    beta = 0.04
    got = losses.grpo_loss(logp, old, ref, adv, mask, clip_eps_low=0.2, beta=beta, kl="k3",
                           loss_type=loss_type, max_completion_length=8)
    # Independent per-token computation in numpy.
    r = np.exp(logp.numpy() - old.numpy())
    a = adv.numpy()[:, None]
    pg = np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
    d = ref.numpy() - logp.numpy()
    tok = -pg + beta * (np.exp(d) - d - 1)
    m = mask.numpy().astype(float)
    expected = {
        "grpo": np.mean((tok * m).sum(1) / m.sum(1)),
        "bnpo": (tok * m).sum() / m.sum(),
        "dapo": (tok * m).sum() / m.sum(),
        "dr_grpo": (tok * m).sum() / (m.shape[0] * 8),
    }[loss_type]
    np.testing.assert_allclose(float(got), expected, rtol=1e-12)


def test_on_policy_loss_is_zero_with_nonzero_gradient():
    logp, _, _, _, mask = _batch()
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=D)
    adv = losses.group_advantages(rewards).reshape(-1)
    theta = logp.clone().requires_grad_(True)
    loss = losses.grpo_loss(theta, theta.detach(), None, adv, mask, loss_type="grpo")
    assert abs(float(loss.detach())) < 1e-15
    loss.backward()
    assert theta.grad.abs().max() > 1e-3
    # The gradient is -A_i / |o_i| on each unmasked token (d ratio / d logp = 1 on-policy).
    expected = -(adv[:, None] / mask.sum(1, keepdim=True)) * mask / len(adv)
    np.testing.assert_allclose(theta.grad.numpy(), expected.numpy(), atol=1e-15)


def _expected_grad(kl):
    """E_{o~pi}[grad k(o)] on a 5-outcome tabular policy, by exact expectation."""
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(5, generator=g, dtype=D).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(5, generator=g, dtype=D), 0)
    logp = torch.log_softmax(theta, 0)
    weights = logp.exp().detach()  # the sampling distribution is not differentiated
    per_outcome = losses.kl_penalty(logp.unsqueeze(1), ref.unsqueeze(1), kl,
                                    old_logp=logp.detach().unsqueeze(1))[:, 0]
    (grad,) = torch.autograd.grad((weights * per_outcome).sum(), theta)
    return theta, ref, grad, (weights * per_outcome).sum()


def _kl(p_logp, q_logp):
    return (p_logp.exp() * (p_logp - q_logp)).sum()


def test_k3_gradient_is_reverse_kl_gradient():
    theta, ref, grad, value = _expected_grad("k3")
    logp = torch.log_softmax(theta, 0)
    (reverse,) = torch.autograd.grad(_kl(ref, logp), theta)
    (forward,) = torch.autograd.grad(_kl(torch.log_softmax(theta, 0), ref), theta)
    np.testing.assert_allclose(grad.numpy(), reverse.numpy(), atol=1e-14)
    assert not np.allclose(grad.numpy(), forward.numpy(), atol=1e-3)
    # ... while its value is unbiased for KL(pi||ref).
    np.testing.assert_allclose(float(value.detach()), float(_kl(logp.detach(), ref)), rtol=1e-12)


@pytest.mark.parametrize("kl", ["k2", "k3_ratio"])
def test_k2_and_ratio_weighted_k3_follow_forward_kl(kl):
    theta, ref, grad, _ = _expected_grad(kl)
    (forward,) = torch.autograd.grad(_kl(torch.log_softmax(theta, 0), ref), theta)
    np.testing.assert_allclose(grad.numpy(), forward.numpy(), atol=1e-14)


def test_k1_has_zero_expected_gradient():
    _, _, grad, _ = _expected_grad("k1")
    np.testing.assert_allclose(grad.numpy(), 0.0, atol=1e-15)


def test_two_kl_anchor_mixes_reference_and_previous():
    logp, old, ref, adv, mask = _batch()
    both = losses.grpo_loss(logp, old, ref, adv, mask, beta=0.1, kl="k2", alpha=0.3)
    pg = losses.grpo_loss(logp, old, ref, adv, mask, beta=0.0)
    to_ref = losses.grpo_loss(logp, old, ref, adv, mask, beta=0.1, kl="k2") - pg
    to_old = losses.grpo_loss(logp, old, ref, adv, mask, beta=0.1, kl="k2", alpha=0.0) - pg
    np.testing.assert_allclose(float(both), float(pg + 0.3 * to_ref + 0.7 * to_old), rtol=1e-12)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"clip_eps_low": -0.1}, "clip_eps_low"), ({"clip_eps_low": 1.5}, "clip_eps_low"),
    ({"clip_eps_high": -1.0}, "clip_eps_high"),
    ({"clip_eps_low": None, "clip_eps_high": 0.3}, "clip_eps_high"),
    ({"beta": -1.0}, "beta"), ({"kl": "k4"}, "kl"), ({"loss_type": "sum"}, "loss_type"),
    ({"max_completion_length": 2, "loss_type": "dr_grpo"}, "max_completion_length"),
])
def test_grpo_loss_rejects_bad_values(kwargs, name):
    logp, old, ref, adv, mask = _batch()
    with pytest.raises(ValueError, match=name) as info:
        losses.grpo_loss(logp, old, ref, adv, mask, **kwargs)
    assert "got" in str(info.value)


def test_grpo_loss_rejects_bad_shapes():
    logp, old, ref, adv, mask = _batch()
    with pytest.raises(ValueError, match="advantages"):
        losses.grpo_loss(logp, old, ref, adv[:2], mask)
    with pytest.raises(ValueError, match="ref_logp"):
        losses.grpo_loss(logp, old, None, adv, mask, beta=0.1)


def test_exact_objective_is_maximised_by_theorem8_policy():
    # Theorem 8: argmax = anchor * exp(A / beta) / Z with the geometric-mean anchor (Lemma 2).
    g = torch.Generator().manual_seed(0)
    ref = torch.log_softmax(torch.randn(3, 6, generator=g, dtype=D), 1)
    prev = torch.log_softmax(torch.randn(3, 6, generator=g, dtype=D), 1)
    success = torch.rand(3, 6, generator=g) < 0.4
    success[:, 0] = True
    success[:, 1] = False
    wp, wm = torch.tensor([1.0, 2.0, 0.5], dtype=D), torch.tensor([0.3, 0.1, 1.0], dtype=D)
    beta, alpha = 0.7, 0.4
    adv = torch.where(success, wp[:, None], -wm[:, None])
    star = torch.log_softmax(alpha * ref + (1 - alpha) * prev + adv / beta, 1)

    def objective(logp):
        return losses.exact_objective(logp, success, wp, wm, beta=beta, ref_logp=ref,
                                      prev_logp=prev, alpha=alpha)

    best = objective(star)
    for _ in range(20):
        other = torch.log_softmax(star + 0.1 * torch.randn(3, 6, generator=g, dtype=D), 1)
        assert torch.all(objective(other) < best)
