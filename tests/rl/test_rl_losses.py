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
                                    prev_logp=logp.detach().unsqueeze(1))[:, 0]
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


# --- the losses API of the restructured trainer: kl="exact", per-sequence beta,
# anchor_penalty, clipped_tokens, KL_CHOICES; each against a computation written out here ---


def _np_surrogate(logp, old, adv, low=0.8, high=1.2):
    """-min(r A, clip(r, low, high) A) per token, in numpy."""
    r = np.exp(np.asarray(logp) - np.asarray(old))
    a = np.asarray(adv)[:, None]
    return -np.minimum(r * a, np.clip(r, low, high) * a)


def _np_kl(logp, logq):
    """KL(p||q) = sum_o p(o) log(p(o) / q(o)) per row, written out with the probabilities."""
    p, q = np.exp(logp), np.exp(logq)
    return (p * np.log(p / q)).sum(axis=-1)


def _tabular_case(seed=0, n_prompts=3, n_outputs=5, group=4):
    """Tabular policies and one sampled output per sequence (a bandit: one token each)."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(n_prompts, n_outputs, generator=g, dtype=D)
    ref = torch.log_softmax(torch.randn(n_prompts, n_outputs, generator=g, dtype=D), 1)
    old = torch.log_softmax(theta + 0.3 * torch.randn(n_prompts, n_outputs, generator=g,
                                                      dtype=D), 1)
    prompt = torch.arange(n_prompts).repeat_interleave(group)
    output = torch.randint(n_outputs, (n_prompts * group,), generator=g)
    adv = torch.randn(n_prompts * group, generator=g, dtype=D)
    return theta, ref, old, prompt, output, adv


def _exact_loss_by_hand(theta, ref, old, prompt, output, adv, beta, alpha):
    """The aggregated ("grpo") clipped surrogate plus beta times the exact KL anchor, in numpy."""
    logp_all = theta - np.log(np.exp(theta).sum(axis=1, keepdims=True))
    logp = logp_all[prompt, output][:, None]
    surrogate = _np_surrogate(logp, old[prompt, output][:, None], adv).mean()
    kl = alpha * _np_kl(logp_all, ref).mean() + (1 - alpha) * _np_kl(logp_all, old).mean()
    return surrogate + beta * kl


def _exact_loss(theta, ref, old, prompt, output, adv, beta, alpha):
    logp_all = torch.log_softmax(theta, 1)
    logp = logp_all[prompt, output][:, None]
    mask = torch.ones_like(logp, dtype=torch.bool)
    return losses.grpo_loss(logp, old[prompt, output][:, None], None, adv, mask, beta=beta,
                            kl="exact", alpha=alpha, tabular=(logp_all, ref, old))


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.3])
def test_exact_kl_loss_is_the_tabular_kl_written_out(alpha):
    theta, ref, old, prompt, output, adv = _tabular_case()
    beta = 0.7
    got = _exact_loss(theta, ref, old, prompt, output, adv, beta, alpha)
    args = (theta.numpy(), ref.numpy(), old.numpy(), prompt.numpy(), output.numpy(), adv.numpy())
    np.testing.assert_allclose(float(got), _exact_loss_by_hand(*args, beta, alpha), rtol=1e-12)
    # the KL is what makes the difference: beta = 0 leaves the surrogate alone
    np.testing.assert_allclose(float(_exact_loss(theta, ref, old, prompt, output, adv, 0.0, alpha)),
                               _exact_loss_by_hand(*args, 0.0, alpha), rtol=1e-12)
    assert abs(float(got) - _exact_loss_by_hand(*args, 0.0, alpha)) > 1e-3


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.3])
def test_exact_kl_loss_gradient_matches_finite_differences(alpha):
    theta, ref, old, prompt, output, adv = _tabular_case(seed=1)
    beta = 0.7
    # no ratio within 1e-4 of a clip bound, where the loss has a kink
    ratio = torch.exp(torch.log_softmax(theta, 1) - old)[prompt, output]
    assert float(torch.min(torch.abs(ratio - 0.8))) > 1e-4
    assert float(torch.min(torch.abs(ratio - 1.2))) > 1e-4
    x = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_exact_loss(x, ref, old, prompt, output, adv, beta, alpha), x)
    args = (ref.numpy(), old.numpy(), prompt.numpy(), output.numpy(), adv.numpy(), beta, alpha)
    base, h = theta.numpy(), 1e-6
    numeric = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        up, down = base.copy(), base.copy()
        up[idx] += h
        down[idx] -= h
        numeric[idx] = (_exact_loss_by_hand(up, *args) - _exact_loss_by_hand(down, *args)) / (2 * h)
    np.testing.assert_allclose(grad.numpy(), numeric, atol=1e-8)
    assert np.abs(numeric).max() > 1e-2


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"beta": 0.1, "tabular": None}, "tabular"),
    ({"beta": 0.1, "tabular": "two"}, "tabular"),
    ({"beta": torch.full((12,), 0.1, dtype=D)}, "beta"),
    ({"beta": -0.1}, "beta"),
    ({"beta": 0.1, "alpha": 1.5}, "alpha"),
    ({"beta": 0.1, "alpha": float("nan")}, "alpha"),
])
def test_exact_kl_loss_rejects_bad_values(kwargs, name):
    theta, ref, old, prompt, output, adv = _tabular_case()
    logp_all = torch.log_softmax(theta, 1)
    logp = logp_all[prompt, output][:, None]
    kwargs = {"tabular": (logp_all, ref, old), **kwargs}
    if kwargs["tabular"] == "two":
        kwargs["tabular"] = (logp_all, ref)
    with pytest.raises(ValueError, match=name) as info:
        losses.grpo_loss(logp, old[prompt, output][:, None], None, adv,
                         torch.ones_like(logp, dtype=torch.bool), kl="exact", **kwargs)
    assert "got" in str(info.value)


def test_exact_kl_loss_rejects_mismatched_tabular_shapes():
    theta, ref, old, prompt, output, adv = _tabular_case()
    logp_all = torch.log_softmax(theta, 1)
    logp = logp_all[prompt, output][:, None]
    with pytest.raises(ValueError, match="tabular"):
        losses.grpo_loss(logp, old[prompt, output][:, None], None, adv,
                         torch.ones_like(logp, dtype=torch.bool), beta=0.1, kl="exact",
                         tabular=(logp_all, ref[:, :4], old))


@pytest.mark.parametrize("loss_type", losses.LOSS_TYPES)
@pytest.mark.parametrize(("kl", "alpha"), [("k3", 1.0), ("k3_ratio", 0.4), ("k2", 0.0)])
def test_per_sequence_beta_is_a_loop_over_sequences(loss_type, kl, alpha):
    logp, old, ref, adv, mask = _batch(seed=2)
    beta = torch.tensor([0.0, 0.05, 0.3, 1.0, 0.2, 0.0], dtype=D)
    x = logp.clone().requires_grad_(True)
    got = losses.grpo_loss(x, old, ref, adv, mask, beta=beta, kl=kl, alpha=alpha,
                           loss_type=loss_type, max_completion_length=8)
    # one sequence at a time, each with its own scalar beta, recombined with the weights each
    # aggregation gives a sequence: equal (grpo, dr_grpo) or its number of tokens (bnpo, dapo)
    y = logp.clone().requires_grad_(True)
    tokens = mask.sum(1).to(D)
    share = tokens / tokens.sum() if loss_type in ("bnpo", "dapo") else torch.full_like(
        tokens, 1 / len(tokens))
    looped = sum(share[i] * losses.grpo_loss(
        y[i:i + 1], old[i:i + 1], ref[i:i + 1], adv[i:i + 1], mask[i:i + 1], beta=float(beta[i]),
        kl=kl, alpha=alpha, loss_type=loss_type, max_completion_length=8)
        for i in range(len(beta)))
    np.testing.assert_allclose(float(got.detach()), float(looped.detach()), rtol=1e-12)
    (g_got,) = torch.autograd.grad(got, x)
    (g_loop,) = torch.autograd.grad(looped, y)
    np.testing.assert_allclose(g_got.numpy(), g_loop.numpy(), rtol=1e-12, atol=1e-15)
    # and a tensor of equal weights is the scalar
    same = losses.grpo_loss(logp, old, ref, adv, mask, beta=torch.full_like(beta, 0.3), kl=kl,
                            alpha=alpha, loss_type=loss_type, max_completion_length=8)
    scalar = losses.grpo_loss(logp, old, ref, adv, mask, beta=0.3, kl=kl, alpha=alpha,
                              loss_type=loss_type, max_completion_length=8)
    np.testing.assert_allclose(float(same), float(scalar), rtol=1e-14)


@pytest.mark.parametrize("beta", [
    torch.full((5,), 0.1, dtype=D), torch.full((6, 1), 0.1, dtype=D),
    torch.tensor([0.1, 0.1, -0.1, 0.1, 0.1, 0.1], dtype=D),
    torch.tensor([0.1, 0.1, float("nan"), 0.1, 0.1, 0.1], dtype=D),
    torch.tensor([0.1, 0.1, float("inf"), 0.1, 0.1, 0.1], dtype=D),
])
def test_per_sequence_beta_rejects_bad_tensors(beta):
    logp, old, ref, adv, mask = _batch()
    with pytest.raises(ValueError, match="beta") as info:
        losses.grpo_loss(logp, old, ref, adv, mask, beta=beta)
    assert "got" in str(info.value)


def test_per_sequence_beta_needs_ref_logp_only_when_some_weight_is_positive():
    logp, old, ref, adv, mask = _batch()
    zeros = torch.zeros(6, dtype=D)
    np.testing.assert_allclose(float(losses.grpo_loss(logp, old, None, adv, mask, beta=zeros)),
                               float(losses.grpo_loss(logp, old, ref, adv, mask)), rtol=1e-14)
    with pytest.raises(ValueError, match="ref_logp"):
        losses.grpo_loss(logp, old, None, adv, mask, beta=zeros + 0.1)


def _anchor_terms(seed=4):
    g = torch.Generator().manual_seed(seed)
    cur, ref, old = (torch.log_softmax(torch.randn(3, 5, generator=g, dtype=D), 1)
                     for _ in range(3))
    return cur, ref, old


def _unused():
    raise AssertionError("a KL term whose weight is 0 was computed")


@pytest.mark.parametrize("alpha", [1.0, 0.0, 0.3])
def test_anchor_penalty_mixes_the_two_kl_terms_written_out(alpha):
    cur, ref, old = _anchor_terms()
    to_ref, to_old = _np_kl(cur.numpy(), ref.numpy()), _np_kl(cur.numpy(), old.numpy())
    got = losses.anchor_penalty(
        alpha, {"reference": (lambda: losses.tabular_kl(cur, ref)) if alpha > 0 else _unused,
                "prev": (lambda: losses.tabular_kl(cur, old)) if alpha < 1 else _unused},
        torch.zeros(3, dtype=D))
    np.testing.assert_allclose(got.numpy(), alpha * to_ref + (1 - alpha) * to_old, rtol=1e-12)
    assert got.dtype == D and got.shape == (3,)


def test_anchor_penalty_takes_shape_and_dtype_from_like():
    cur, ref, _ = _anchor_terms()
    got = losses.anchor_penalty(1.0, {"reference": lambda: losses.tabular_kl(cur, ref).mean(),
                                      "prev": _unused}, torch.zeros(2, 4, dtype=D))
    expected = _np_kl(cur.numpy(), ref.numpy()).mean()
    np.testing.assert_allclose(got.numpy(), np.full((2, 4), expected), rtol=1e-12)


@pytest.mark.parametrize("alpha", [1.5, -0.5, float("nan")])
def test_anchor_penalty_rejects_alpha_outside_unit_interval(alpha):
    cur, ref, old = _anchor_terms()
    with pytest.raises(ValueError, match="alpha"):
        losses.anchor_penalty(alpha, {"reference": lambda: losses.tabular_kl(cur, ref),
                                      "prev": lambda: losses.tabular_kl(cur, old)},
                              torch.zeros(3, dtype=D))


@pytest.mark.parametrize("anchor", [theory.Anchor.reference(), theory.Anchor.mirror(),
                                    theory.Anchor.two_kl(0.3),
                                    theory.Anchor(((0.25, "prev"), (0.75, "reference")))],
                         ids=lambda a: a.kind)
def test_an_anchor_gives_the_loss_of_its_share(anchor):
    """Every loss takes an Anchor in place of ``alpha`` and gives the same number, bit for bit."""
    cur, ref, old = _anchor_terms()
    kls = {"reference": lambda: losses.tabular_kl(cur, ref),
           "prev": lambda: losses.tabular_kl(cur, old)}
    like = torch.zeros(3, dtype=D)
    assert torch.equal(losses.anchor_penalty(anchor, kls, like),
                       losses.anchor_penalty(anchor.alpha, kls, like))
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(4, 5, dtype=D, generator=g)
    prev = torch.randn(4, 5, dtype=D, generator=g)
    refl = torch.randn(4, 5, dtype=D, generator=g)
    adv = torch.randn(4, dtype=D, generator=g)
    mask = torch.ones(4, 5, dtype=D)
    for kl in losses.KL_ESTIMATORS:
        assert torch.equal(
            losses.grpo_loss(logp, prev, refl, adv, mask, beta=0.2, kl=kl, anchor=anchor),
            losses.grpo_loss(logp, prev, refl, adv, mask, beta=0.2, kl=kl, alpha=anchor.alpha))
    succ = torch.rand(4, 5, generator=g) < 0.5
    w = torch.rand(4, dtype=D, generator=g)
    assert torch.equal(
        losses.exact_objective(logp, succ, w, w, beta=0.3, ref_logp=refl, prev_logp=prev,
                               anchor=anchor),
        losses.exact_objective(logp, succ, w, w, beta=0.3, ref_logp=refl, prev_logp=prev,
                               alpha=anchor.alpha))


def test_anchor_and_a_different_alpha_are_refused():
    cur, ref, old = _anchor_terms()
    with pytest.raises(ValueError, match="alpha"):
        losses.exact_objective(cur, cur > -1.0, torch.ones(3, dtype=D), torch.ones(3, dtype=D),
                               beta=0.1, ref_logp=ref, prev_logp=old, alpha=0.3,
                               anchor=theory.Anchor.mirror())
    with pytest.raises(ValueError, match="anchor"):
        losses.exact_objective(cur, cur > -1.0, torch.ones(3, dtype=D), torch.ones(3, dtype=D),
                               beta=0.1, ref_logp=ref, prev_logp=old, anchor=0.3)


def _ppo_rule(logp, old, adv, eps_low, eps_high):
    """Clipped where the ratio is past the bound in the direction the advantage pushes."""
    high = eps_low if eps_high is None else eps_high
    out = np.zeros(logp.shape, dtype=bool)
    for i, j in np.ndindex(logp.shape):
        ratio = math.exp(float(logp[i, j]) - float(old[i, j]))
        out[i, j] = (adv[i] > 0 and ratio > 1 + high) or (adv[i] < 0 and ratio < 1 - eps_low)
    return out


@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.2, None), (0.2, 0.28), (0.05, 0.5),
                                                   (0.0, 0.0)])
def test_clipped_tokens_is_the_ppo_rule_written_out(eps_low, eps_high):
    logp, old, _, adv, _ = _batch(seed=5)
    adv[1] = 0.0  # a zero advantage pushes nowhere: never clipped
    got = losses.clipped_tokens(logp, old, adv, clip_eps_low=eps_low, clip_eps_high=eps_high)
    expected = _ppo_rule(logp.numpy(), old.numpy(), adv.numpy(), eps_low, eps_high)
    assert got.dtype == torch.bool
    np.testing.assert_array_equal(got.numpy(), expected)
    assert expected.any() and not expected.all()
    assert not got[1].any()
    # the mask per_token_loss returns, and where its surrogate has no gradient
    x = logp.clone().requires_grad_(True)
    loss, clipped = losses.per_token_loss(x, old, None, adv, clip_eps_low=eps_low,
                                          clip_eps_high=eps_high)
    assert torch.equal(clipped, got)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    assert torch.all(grad[got] == 0)


@pytest.mark.parametrize("off", [None, math.inf])
def test_clipped_tokens_without_clipping_is_all_false(off):
    logp, old, _, adv, _ = _batch(seed=5)
    got = losses.clipped_tokens(3 * logp, old, adv, clip_eps_low=off)
    assert got.shape == logp.shape and got.dtype == torch.bool and not got.any()


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"clip_eps_low": -0.1}, "clip_eps_low"), ({"clip_eps_low": 1.5}, "clip_eps_low"),
    ({"clip_eps_low": float("nan")}, "clip_eps_low"), ({"clip_eps_high": -1.0}, "clip_eps_high"),
    ({"clip_eps_low": None, "clip_eps_high": 0.3}, "clip_eps_high"),
])
def test_clipped_tokens_rejects_bad_values(kwargs, name):
    logp, old, _, adv, _ = _batch()
    with pytest.raises(ValueError, match=name) as info:
        losses.clipped_tokens(logp, old, adv, **kwargs)
    assert "got" in str(info.value)


@pytest.mark.parametrize("which", ["advantages", "prev_logp"])
def test_clipped_tokens_rejects_bad_shapes(which):
    logp, old, _, adv, _ = _batch()
    args = {"advantages": (logp, old, adv[:, None]), "prev_logp": (logp, old[:, :1], adv)}[which]
    with pytest.raises(ValueError, match=which):
        losses.clipped_tokens(*args)


def test_kl_choices_are_the_estimator_registry_and_exact():
    from grpo_companion.theory.kl_estimators import KL_ESTIMATORS

    assert losses.KL_CHOICES == ("exact", *KL_ESTIMATORS)
    assert losses.KL_ESTIMATORS == tuple(KL_ESTIMATORS)


def _registered_estimators():
    from grpo_companion.theory.kl_estimators import KL_ESTIMATORS

    return tuple(KL_ESTIMATORS)


@pytest.mark.parametrize("kl", _registered_estimators())
def test_every_registered_estimator_is_the_theory_value_in_the_loss(kl):
    from grpo_companion.theory.kl_estimators import KL_ESTIMATORS

    estimator = KL_ESTIMATORS[kl]
    logp, old, ref, adv, mask = _batch(seed=6)
    ref = ref.clone()
    ref[0] = logp[0] + torch.linspace(1.5, 6.0, logp.shape[1], dtype=D)  # d > 1 as well
    lp, lo, lr = logp.numpy(), old.numpy(), ref.numpy()

    def theory_value(anchor):
        value = estimator.value(anchor - lp, np)
        return np.exp(lp - lo) * value if estimator.ratio_weighted else value

    got = losses.kl_penalty(logp, ref, kl, prev_logp=old)
    np.testing.assert_allclose(got.numpy(), theory_value(lr), rtol=1e-12, atol=1e-15)
    # grpo_loss accepts it, and its value is the surrogate plus the theory's penalty
    beta, alpha = 0.2, 0.6
    loss = losses.grpo_loss(logp, old, ref, adv, mask, beta=beta, kl=kl, alpha=alpha,
                            loss_type="bnpo")
    tok = _np_surrogate(lp, lo, adv.numpy()) + beta * (
        alpha * theory_value(lr) + (1 - alpha) * theory_value(lo))
    m = mask.numpy()
    np.testing.assert_allclose(float(loss), (tok * m).sum() / m.sum(), rtol=1e-12)
