"""Our GRPO loss and advantages against TRL's own code (trl.GRPOTrainer, TRL 1.16.0).

Nothing of TRL is re-implemented here: every TRL number comes from a real
``GRPOTrainer`` built offline on a tiny random Llama (``_tiny.py``), through

- ``GRPOTrainer._compute_loss``, the loss of one micro-batch, fed either with
  per-token log-probabilities we choose (its one model call,
  ``_get_per_token_logps_and_entropies``, is replaced on the instance by one that
  returns them, so the loss arithmetic in float64 is TRL's and nothing else) or
  with the model's real forward (gradients with respect to the parameters);
- ``GRPOTrainer._generate_and_score_completions``, which samples completions,
  scores them with a reward function and computes the group advantages; the
  reward function returns rewards the test chose.

and compared with :mod:`grpo_companion.rl.losses` under the mapping of
:func:`grpo_companion.practice.trl_bridge.loss_settings`. Tolerances are tight
(1e-12 in float64) on purpose: a TRL release that changes its loss or its
advantages fails here. On an upgrade, see ``test_trl_is_the_pinned_version``.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib

import numpy as np
import pytest
import torch
import trl

from grpo_companion import theory
from grpo_companion.practice.trl_bandit import trl_advantages, trl_loss
from grpo_companion.practice.trl_bridge import (
    TRL_STD_EPS,
    advantage_calibration,
    loss_settings,
)
from grpo_companion.rl import losses
from grpo_companion.theory.kl_estimators import expected_kl_gradient

from ..setup._load import ROOT
from . import _tiny

TIGHT = 1e-12  # float64 agreement of loss values and gradients


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return _tiny.save_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def make(model_path, tmp_path_factory):
    """``make(**settings)``: a GRPOTrainer with those GRPOConfig settings (cached)."""
    out = tmp_path_factory.mktemp("grpo-out")

    @functools.cache
    def build(items):
        trainer = _tiny.trainer(model_path, out, _tiny.target_reward, **dict(items))
        # the training loop sets this before each micro-batch (transformers.Trainer); one
        # micro-batch per optimiser step here
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
        return trainer

    return lambda **settings: build(tuple(sorted(settings.items())))


def test_trl_is_the_pinned_version():
    """The pin and the installed TRL agree.

    On a TRL upgrade: run this file. If a test below fails, read the new
    ``GRPOTrainer._compute_loss`` and the advantage block of
    ``_generate_and_score_completions`` (trl/trainer/grpo_trainer.py), then fix
    ``grpo_companion.rl.losses`` or the mapping in
    ``grpo_companion.practice.trl_bridge`` (never loosen the tolerances to pass),
    and move the pin in pyproject.toml, requirements.lock and environment.yml
    together (tests/setup/test_pins.py checks they agree).
    """
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(re.fullmatch(r"trl==(\S+)", d).group(1) for d in deps if d.startswith("trl=="))
    assert pinned == "1.16.0"
    assert trl.__version__ == pinned, (
        f"TRL {trl.__version__} is installed but {pinned} is pinned; see this test's docstring")


# ---------------------------------------------------------------------------- the loss
def _batch(seed: int, off_policy: bool, beta: float, groups: int = 2, group: int = 4,
           tokens: int = 6):
    """Per-token log-probs and the ``inputs`` dict of ``_compute_loss``, float64."""
    gen = torch.Generator().manual_seed(seed)
    b = groups * group
    logp = -3.0 * torch.rand(b, tokens, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, tokens + 1, (b,), generator=gen)
    lengths[0] = tokens
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    rewards = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 0]], dtype=torch.float64)[:groups]
    advantages = losses.group_advantages(rewards, theory.CALIBRATIONS["trl"]).reshape(-1)
    inputs = {
        "prompt_ids": torch.full((b, 2), 3, dtype=torch.long),
        "prompt_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_ids": torch.randint(3, len(_tiny.WORDS), (b, tokens), generator=gen),
        "completion_mask": mask,
        "advantages": advantages,
        "num_items_in_batch": mask.sum(),
    }
    old = None
    if off_policy:  # ratios spread well past 1 +- 0.28, so both clip branches are in force
        old = logp + 0.4 * torch.randn(b, tokens, generator=gen, dtype=torch.float64)
        inputs["old_per_token_logps"] = old
    ref = None
    if beta > 0:
        ref = logp + 0.6 * torch.randn(b, tokens, generator=gen, dtype=torch.float64)
        inputs["ref_per_token_logps"] = ref
    return logp, old, ref, inputs


CLIPS = {"symmetric": (0.2, None), "asymmetric": (0.2, 0.28),
         "off": (1.0, 1e12)}  # TRL cannot turn clipping off; these bounds never bind
KLS = [(0.0, True), (0.04, False), (0.04, True)]


def _compare(make, loss_type, beta, bias_correction, clip, off_policy, seed=0):
    eps, eps_high = CLIPS[clip]
    trainer = make(loss_type=loss_type, beta=beta, use_bias_correction_kl=bias_correction,
                   epsilon=eps, epsilon_high=eps_high, max_completion_length=8)
    logp0, old, ref, inputs = _batch(seed, off_policy, beta)
    logp = logp0.clone().requires_grad_(True)
    theirs = trl_loss(trainer, logp, inputs)
    (grad_theirs,) = torch.autograd.grad(theirs, logp)

    settings = loss_settings(trainer.args)
    mine_logp = logp0.clone().requires_grad_(True)
    old_mine = mine_logp.detach() if old is None else old
    mask = inputs["completion_mask"]
    mine = losses.grpo_loss(mine_logp, old_mine, ref, inputs["advantages"], mask, **settings)
    (grad_mine,) = torch.autograd.grad(mine, mine_logp)
    if clip == "off":  # the same as our loss with clipping switched off
        unclipped = losses.grpo_loss(logp0, old_mine, ref, inputs["advantages"], mask,
                                     **{**settings, "clip_eps_low": None, "clip_eps_high": None})
        assert abs(unclipped.item() - mine.item()) <= TIGHT
    return theirs, mine, grad_theirs, grad_mine, settings


@pytest.mark.parametrize("off_policy", [False, True], ids=["on_policy", "off_policy"])
@pytest.mark.parametrize("clip", list(CLIPS))
@pytest.mark.parametrize(("beta", "bias_correction"), KLS,
                         ids=["beta0", "beta>0-k3", "beta>0-k3_ratio"])
@pytest.mark.parametrize("loss_type", losses.LOSS_TYPES)
def test_loss_and_gradient_match_trl(make, loss_type, beta, bias_correction, clip, off_policy):
    theirs, mine, grad_theirs, grad_mine, settings = _compare(
        make, loss_type, beta, bias_correction, clip, off_policy)
    assert theirs.dtype == torch.float64
    assert abs(theirs.item() - mine.item()) <= TIGHT, (theirs.item(), mine.item())
    assert torch.allclose(grad_theirs, grad_mine, rtol=0, atol=TIGHT), (
        (grad_theirs - grad_mine).abs().max().item())
    assert grad_mine.abs().max() > 1e-3  # a gradient that is there, not two zeros
    if beta > 0:
        assert settings["kl"] == ("k3_ratio" if bias_correction else "k3")


def test_the_off_policy_batches_exercise_both_clip_branches():
    """The off-policy inputs above put tokens in both clipped regions (the test is not vacuous)."""
    logp, old, ref, inputs = _batch(0, True, 0.04)
    mask = inputs["completion_mask"].bool()
    ratio = torch.exp(logp - old)[mask]
    adv = inputs["advantages"][:, None].expand_as(logp)[mask]
    assert ((ratio > 1.28) & (adv > 0)).any() and ((ratio < 0.8) & (adv < 0)).any()
    assert ((ratio > 1.2) & (ratio < 1.28) & (adv > 0)).any()  # only the symmetric clip binds


@pytest.mark.parametrize("bias_correction", [True, False])
def test_which_kl_gradient_trl_follows(make, bias_correction):
    """``use_bias_correction_kl`` picks the KL whose gradient the penalty follows on policy.

    A one-token bandit with three outcomes: four sequences, outcomes (0, 0, 1, 2), are
    exactly pi = (1/2, 1/4, 1/4), so TRL's ``"grpo"`` mean over sequences is the
    expectation under pi. Zero advantages leave the KL term alone (beta = 1). With
    the correction the gradient in the logits is that of KL(pi || pi_ref) (the
    paper's penalty; TRL's help calls it the reverse KL, we call it forward), without
    it that of KL(pi_ref || pi).
    """
    trainer = make(loss_type="grpo", beta=1.0, use_bias_correction_kl=bias_correction)
    pi = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    outcomes = torch.tensor([0, 0, 1, 2])
    theta = pi.log().clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)[outcomes][:, None]
    ones = torch.ones(4, 1, dtype=torch.long)
    inputs = {"prompt_ids": 3 * ones, "prompt_mask": ones,
              "completion_ids": outcomes[:, None] + 6, "completion_mask": ones,
              "advantages": torch.zeros(4, dtype=torch.float64),
              "ref_per_token_logps": ref.log()[outcomes][:, None],
              "num_items_in_batch": torch.tensor(4)}
    (grad,) = torch.autograd.grad(trl_loss(trainer, logp, inputs), theta)
    kl_forward = (pi * (pi / ref).log()).sum()
    expected = pi * ((pi / ref).log() - kl_forward) if bias_correction else pi - ref
    assert torch.allclose(grad, expected, rtol=0, atol=TIGHT)
    ours = expected_kl_gradient(pi.numpy(), ref.numpy(), "k3_ratio" if bias_correction else "k3")
    np.testing.assert_allclose(grad.numpy(), ours, rtol=0, atol=TIGHT)


def test_loss_and_parameter_gradients_through_the_real_model(make):
    """TRL's whole ``_compute_loss``, model forward included, against ours, off policy.

    TRL's fused LM head computes the log-probabilities in float32 whatever the
    model's dtype, so this comparison is at float32 precision; the float64
    tests above pin the arithmetic. It checks what they cannot: TRL divides the
    logits by ``temperature`` and scores exactly the completion tokens.
    """
    trainer = make(loss_type="dapo", beta=0.04, epsilon=0.2, epsilon_high=0.28,
                   temperature=0.7, per_device_train_batch_size=8, max_completion_length=4)
    model = trainer.model
    prompts = [{"prompt": p, "target": t} for p, t in
               [("say A", 1), ("say A", 0), ("say A", 1), ("say A", 0),
                ("reply with B", 1), ("reply with B", 1), ("reply with B", 1), ("reply with B", 0)]]
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(prompts)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    width = inputs["completion_ids"].shape[1]

    def our_logp():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1]
        scaled = torch.log_softmax(logits.float() / trainer.temperature, dim=-1)
        return scaled.gather(-1, inputs["completion_ids"][..., None])[..., 0]

    with torch.no_grad():
        old = our_logp()
        for p in model.parameters():  # move the policy away from pi_old: ratios != 1
            p.add_(0.2 * torch.randn_like(p))
    inputs["old_per_token_logps"] = old
    params = [p for p in model.parameters() if p.requires_grad]
    theirs = trainer._compute_loss(model, inputs)
    grads_theirs = torch.autograd.grad(theirs, params, allow_unused=True)
    mine = losses.grpo_loss(our_logp(), old, inputs["ref_per_token_logps"],
                            inputs["advantages"], inputs["completion_mask"],
                            **loss_settings(trainer.args))
    grads_mine = torch.autograd.grad(mine, params, allow_unused=True)
    assert abs(theirs.item() - mine.item()) <= 1e-6 * max(1.0, abs(mine.item()))
    scale = max(g.abs().max().item() for g in grads_mine if g is not None)
    assert scale > 1e-4
    for a, b in zip(grads_theirs, grads_mine, strict=True):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert (a - b).abs().max().item() <= 1e-5 * scale


# ---------------------------------------------------------------------- the advantages
def _groups(group: int) -> list[dict]:
    """Every success count k = 0..G once: G + 1 groups of G rows."""
    return [{"prompt": "say A", "target": int(i < k)} for k in range(group + 1)
            for i in range(group)]


@pytest.mark.parametrize("group", [2, 4, pytest.param(16, marks=pytest.mark.slow)])
@pytest.mark.parametrize(("scale", "name"), [("group", "trl"), ("none", "mean_only")])
def test_group_advantages_match_trl(make, group, scale, name):
    trainer = make(scale_rewards=scale, num_generations=group, per_device_train_batch_size=group,
                   max_completion_length=1)
    rows = _groups(group)
    rewards = torch.tensor([r["target"] for r in rows], dtype=torch.float64).reshape(-1, group)
    cal = theory.CALIBRATIONS[name]
    assert advantage_calibration(scale) == cal
    if name == "trl":
        assert (cal.eps, cal.eps_placement, cal.ddof) == (TRL_STD_EPS, "std", 1)
    ours = losses.group_advantages(rewards, cal).reshape(-1)

    exact = trl_advantages(trainer, rows, torch.float64)
    assert exact.dtype == torch.float64
    assert torch.allclose(exact, ours, rtol=0, atol=TIGHT), (exact - ours).abs().max()
    # what a run computes: float32, within its rounding (a few ulps)
    single = trl_advantages(trainer, rows, torch.float32)
    assert single.dtype == torch.float32
    single = single.double()
    assert torch.allclose(single, ours, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    # A group whose rewards are all equal (k = 0 or G) gets exactly 0 from both, in float32
    # too: TRL's mean of G equal 0/1 rewards is exact, so r - mean is 0 before the division
    # by std + 1e-4 (our rl.losses.group_advantages docstring expects about 6e-4 from TRL
    # there; TRL 1.16 gives 0). Only rounding separates the two elsewhere.
    constant = torch.cat([torch.arange(group), torch.arange(group * group, group * (group + 1))])
    assert (single[constant] == 0).all() and (ours[constant] == 0).all()


def test_batch_scaling_has_no_per_prompt_calibration(make):
    """``scale_rewards="batch"``: a group's advantages depend on the other groups."""
    trainer = make(scale_rewards="batch", num_generations=4, per_device_train_batch_size=4,
                   max_completion_length=1)
    one = [{"prompt": "say A", "target": t} for t in (1, 0, 0, 0)]
    others = [[{"prompt": "say B", "target": t} for t in (0, 0, 0, 0)],
              [{"prompt": "say B", "target": t} for t in (1, 1, 1, 0)]]
    first = [trl_advantages(trainer, one + o, torch.float64)[:4] for o in others]
    assert not torch.allclose(first[0], first[1])
    assert advantage_calibration("batch") is None


def test_loss_settings_refuse_what_our_loss_lacks(make):
    trainer = make(loss_type="dapo")
    assert loss_settings(trainer.args)["kl"] == "k3_ratio"  # TRL's default
    for change, message in [({"loss_type": "cispo"}, "cispo"), ({"delta": 2.0}, "delta"),
                            ({"top_entropy_quantile": 0.5}, "top_entropy"),
                            ({"importance_sampling_level": "sequence"}, "importance_sampling")]:
        args = type("Args", (), {**vars(trainer.args), **change})()
        with pytest.raises(ValueError, match=message):
            loss_settings(args)
    assert math.isclose(loss_settings(trainer.args)["clip_eps_high"], 0.2)
