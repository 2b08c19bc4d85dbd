"""GRPO losses: group advantages, the per-token clipped surrogate with a KL
penalty, loss aggregation, and the exact tabular objective.

Everything here is a plain function of tensors, so it can be dropped into any
training loop. Naming: ``eps`` is only the smoothing constant of the reward
normalisation (the paper's epsilon in eq. (4)); the PPO clipping range is
``clip_eps_low`` / ``clip_eps_high``.

How the options map to practice (described in our own words):

- ``group_advantages(rewards, CALIBRATIONS["paper"])`` is the paper's stabilised
  whitening, eq. (4): ``(r - mean) / sqrt(var + eps)``; it is the default.
- ``group_advantages(rewards, CALIBRATIONS["trl"])`` is what TRL's
  ``GRPOTrainer`` does with ``scale_rewards="group"``: divide the centred
  reward by the Bessel-corrected group standard deviation plus ``1e-4``.
  TRL 1.16 defaults to ``scale_rewards="group"``.
- ``CALIBRATIONS["dr_grpo"]`` is Dr. GRPO's centring without scaling, eq. (13)
  (TRL: ``scale_rewards="none"``). TRL's third value, ``"batch"``, divides by
  the standard deviation of the whole batch, which couples the prompts; it has
  no calibration here.
- ``grpo_loss(..., kl="k3")`` adds the plain "k3" estimator of the KL to the
  reference to the per-token loss, as DeepSeekMath does and as TRL does with
  ``use_bias_correction_kl=False`` (or a TRL without that option);
  ``kl="k3_ratio"`` multiplies it by the importance ratio ``pi / pi_prev``, which
  is TRL's ``use_bias_correction_kl=True``. TRL 1.16 defaults to
  ``use_bias_correction_kl=True``. TRL adds the KL term only when ``beta > 0``,
  and TRL 1.16 defaults to ``beta=0.0`` (no KL term, no reference model).
- ``loss_type`` reproduces four of TRL's ways of turning per-token losses into
  one number (see :func:`aggregate`); TRL 1.16 defaults to ``loss_type="dapo"``,
  this module to ``"grpo"``.

Which KL a run follows: the expected gradient of ``"k3_ratio"`` is that of
``KL(pi || pi_ref)``, the paper's penalty, so a run with TRL's default
estimator settles at the paper's fixed point; plain ``"k3"`` follows
``KL(pi_ref || pi)`` and settles at the reverse-KL fixed point
(:mod:`grpo_companion.theory.kl_estimators`). ``tests/practice/test_trl_facts.py``
checks every "TRL x.y defaults to" statement of this module against the
installed TRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

# calibrations are defined once, by the theory package
from grpo_companion.theory.calibration import Calibration, resolve_calibration
from grpo_companion.theory.finite_group import group_table
from grpo_companion.theory.kl_estimators import KL_ESTIMATORS as _ESTIMATORS
from grpo_companion.theory.kl_estimators import kl_estimator_names
from grpo_companion.theory.variants import Anchor
from grpo_companion.validation import check_number as _check_real

#: The per-token KL estimators' names, read from their one registry
#: (``theory.kl_estimators.KL_ESTIMATORS``) whenever used: a tuple-like view that shows
#: estimators registered later too.
KL_ESTIMATORS = kl_estimator_names()
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
#: What ``grpo_loss`` takes as ``kl``: a per-token estimator, or the exact tabular KL (a view).
KL_CHOICES = kl_estimator_names(exact=True)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def group_advantages(
    rewards: torch.Tensor, calibration: Calibration | None = None, **keywords: Any
) -> torch.Tensor:
    """Group-relative advantages of Algorithm 1, line 8, for 0/1 rewards.

    The advantage comes from the calibration's one definition
    (:mod:`grpo_companion.theory.normalizations`): a success in a group with
    ``k`` successes gets ``+plus(k, G)``, a failure ``-minus(k, G)``, looked up
    in the table that :func:`grpo_companion.theory.finite_group.group_table`
    builds in float64. A group whose rewards are all equal gets exactly 0,
    whatever ``eps`` is (it carries no learning signal). TRL 1.16 gives exactly
    0 there too, in float32: its mean of equal 0/1 rewards is exact, so
    ``r - mean`` is 0 before the division.

    Parameters
    ----------
    rewards
        Rewards of shape ``(n_groups, G)``, each 0 or 1: row ``i`` holds the
        ``G`` rewards of the outputs sampled for prompt ``i``.
    calibration
        Default ``Calibration()``, the paper's eq. (4). TRL 1.16 defaults to
        ``scale_rewards="group"``, which is ``CALIBRATIONS["trl"]``
        (``(r - mean) / (std + 1e-4)`` with Bessel's correction). Or pass the
        ``Calibration`` keywords instead.

    Returns
    -------
    torch.Tensor
        Advantages of shape ``(n_groups, G)``, in the dtype of ``rewards``.
    """
    cal = resolve_calibration(calibration, **keywords)
    if rewards.ndim != 2:
        raise ValueError(
            f"rewards must have shape (n_groups, group_size), got {tuple(rewards.shape)}"
        )
    group_size = rewards.shape[1]
    if group_size < 1 + cal.ddof:
        raise ValueError(f"group_size must be >= {1 + cal.ddof} with ddof={cal.ddof}, "
                         f"got {group_size}")
    success = rewards == 1
    if not bool((success | (rewards == 0)).all()):
        bad = rewards[~(success | (rewards == 0))].flatten()[0].item()
        raise ValueError(f"rewards must each be 0 or 1 (verifiable rewards), got {bad!r}")
    plus, minus = (torch.as_tensor(t, dtype=rewards.dtype, device=rewards.device)
                   for t in group_table(cal, group_size))
    k = success.sum(dim=1, keepdim=True).expand_as(rewards)
    return torch.where(success, plus[k], -minus[k])


def kl_penalty(
    logp: torch.Tensor, anchor_logp: torch.Tensor, kl: str, prev_logp: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token KL estimator between the policy and an anchor, on samples.

    With ``d = anchor_logp - logp`` (log of the anchor-to-policy ratio), the value of
    the estimator named ``kl`` in
    :data:`grpo_companion.theory.kl_estimators.KL_ESTIMATORS`, the one place each
    estimator is defined (its formula, the divergence its expected gradient follows,
    its TRL setting): :meth:`~grpo_companion.theory.kl_estimators.KLEstimator.per_token`
    with ``xp = torch``. A ratio-weighted estimator (``"k3_ratio"``, TRL's
    ``use_bias_correction_kl=True``; TRL 1.16 defaults to ``use_bias_correction_kl=True``)
    is multiplied by the differentiated importance ratio ``pi / pi_prev`` and needs
    ``prev_logp``. :func:`~grpo_companion.theory.kl_estimators.kl_estimator_help` lists them.
    """
    _check_choice("kl", kl, tuple(_ESTIMATORS))
    estimator = _ESTIMATORS[kl]
    if estimator.ratio_weighted and prev_logp is None:
        raise ValueError(f"kl={kl!r} needs prev_logp, got None")
    return estimator.per_token(logp, anchor_logp, prev_logp, torch)


def _clip_bounds(
    clip_eps_low: float | None, clip_eps_high: float | None
) -> tuple[float, float] | None:
    if clip_eps_low is None or clip_eps_low == math.inf:
        if clip_eps_high is not None and clip_eps_high != math.inf:
            raise ValueError(
                f"clip_eps_high must be None when clipping is off (clip_eps_low="
                f"{clip_eps_low!r}), got {clip_eps_high!r}"
            )
        return None
    _check_real("clip_eps_low", clip_eps_low, 0.0, 1.0)
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    _check_real("clip_eps_high", high, 0.0, math.inf)
    return 1.0 - clip_eps_low, 1.0 + high


def clipped_tokens(
    logp: torch.Tensor,
    prev_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = None,
) -> torch.Tensor:
    """Which tokens have the clipped branch of (GRPO-Clip) in force (Section 2).

    ``(batch, tokens)`` booleans: the ratio ``exp(logp - prev_logp)`` is below
    ``1 - clip_eps_low`` where the advantage is negative, or above
    ``1 + clip_eps_high`` where it is positive; all False without clipping. The
    same mask :func:`per_token_loss` returns (the trainer logs its mean as
    ``clip_fraction``).
    """
    if logp.dim() != 2 or prev_logp.shape != logp.shape:
        raise ValueError("logp and prev_logp must both have shape (batch, tokens), got "
                         f"{tuple(logp.shape)} and prev_logp {tuple(prev_logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must have shape (batch,) = {tuple(logp.shape[:1])}, "
                         f"got {tuple(advantages.shape)}")
    bounds = _clip_bounds(clip_eps_low, clip_eps_high)
    ratio = torch.exp(logp - prev_logp)
    adv = advantages.unsqueeze(1)
    if bounds is None:
        return torch.zeros_like(ratio * adv, dtype=torch.bool)
    low, high = bounds
    return ((ratio < low) & (adv < 0)) | ((ratio > high) & (adv > 0))


def _anchor_of(alpha: float, anchor: Anchor | None) -> Anchor:
    """``anchor``, or the anchor of reference share ``alpha`` when it is None."""
    if anchor is None:
        _check_real("alpha", alpha, 0.0, 1.0)
        return Anchor(float(alpha))
    if not isinstance(anchor, Anchor):
        raise ValueError(f"anchor must be a theory.Anchor or None, got {anchor!r}")
    if alpha != 1.0 and alpha != anchor.alpha:
        raise ValueError(f"alpha must be left at 1.0 or equal the anchor's share "
                         f"{anchor.alpha!r} when anchor is given, got {alpha!r}")
    return anchor


def anchor_penalty(
    anchor: Anchor | float,
    kls: Mapping[str, Callable[[], torch.Tensor]],
    like: torch.Tensor,
) -> torch.Tensor:
    """The KL anchor of eq. (17): ``sum weight * KL(pi || target)`` over the anchor's pairs.

    ``Anchor.reference()`` is GRPO's penalty (eq. 6), ``Anchor.mirror()`` Mirror
    GRPO's (eq. 9), ``Anchor(alpha)`` the two-KL mix
    ``alpha KL(pi||pi_ref) + (1 - alpha) KL(pi||pi_prev)``; a number is taken as that
    ``alpha``. The pairs are read by :meth:`grpo_companion.theory.Anchor.mix`, the
    one place they are mixed.

    Parameters
    ----------
    anchor : Anchor or float
        The anchor, or its reference share ``alpha`` in [0, 1].
    kls : mapping
        For each target of :data:`grpo_companion.theory.variants.ANCHOR_TARGETS` the
        anchor uses (``"reference"``, ``"prev"``), a function of no argument that
        computes the KL term to it (a per-token estimate, an exact tabular KL or its
        mean over prompts); a target whose weight is 0 is not computed.
    like : torch.Tensor
        The sum starts from zeros shaped and typed like it.

    Returns
    -------
    torch.Tensor
        The weighted sum of the KL terms.
    """
    mix = anchor if isinstance(anchor, Anchor) else _anchor_of(anchor, None)
    return mix.mix(kls, lazy=True, start=torch.zeros_like(like))


def per_token_loss(
    logp: torch.Tensor,
    prev_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = None,
    beta: float | torch.Tensor = 0.0,
    kl: str = "k3",
    alpha: float = 1.0,
    anchor: Anchor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token GRPO loss (the negated objective of (GRPO-Clip), Section 2).

    ``loss = -min(ratio * A, clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * A)
    + beta * (alpha * k(pi, pi_ref) + (1 - alpha) * k(pi, pi_prev))`` with
    ``ratio = exp(logp - prev_logp)`` and ``k`` the estimator named by ``kl``.
    Because of the ``min``, the clip only acts in the direction the advantage
    pushes: for ``A > 0`` the ratio is capped at ``1 + clip_eps_high``, for
    ``A < 0`` at ``1 - clip_eps_low`` (PPO / TRL; DAPO's "clip-higher" is
    ``clip_eps_high > clip_eps_low``). The KL anchor mixes the reference
    (``alpha = 1``, the paper's GRPO, eq. (6)) and the previous policy
    ``pi_prev`` (``alpha = 0``, Mirror GRPO, eq. (9)); ``0 < alpha < 1`` is the
    two-KL objective of eq. (17).

    Parameters
    ----------
    logp, prev_logp, ref_logp
        Per-token log-probabilities ``(batch, tokens)`` of the sampled tokens
        under the policy being optimised, the sampling (previous) policy and the
        reference. ``ref_logp`` may be ``None`` when ``beta == 0`` or
        ``alpha == 0``.
    advantages
        One advantage per sequence, shape ``(batch,)``.
    clip_eps_low, clip_eps_high
        PPO clipping range; ``clip_eps_low=None`` (or ``inf``) turns clipping
        off; ``clip_eps_high=None`` means ``clip_eps_high = clip_eps_low``.
    beta
        KL penalty weight (``>= 0``): a number, or one weight per sequence,
        shape ``(batch,)`` (a per-prompt ``beta``, as chapter 8 uses to spread
        the fixed points over prompts).
    kl
        ``"k1" | "k2" | "k3" | "k3_ratio"``, see :func:`kl_penalty`.
    alpha
        Share of the reference in the KL anchor, in ``[0, 1]``.
    anchor
        The KL anchor as a :class:`~grpo_companion.theory.Anchor` (then ``alpha`` is
        left at 1.0, or equals its share); ``None``: ``Anchor(alpha)``.

    Returns
    -------
    (loss, clipped)
        Per-token losses ``(batch, tokens)`` and a boolean tensor marking the
        tokens where the clipped branch is the one in force.
    """
    bounds = _clip_bounds(clip_eps_low, clip_eps_high)
    if isinstance(beta, torch.Tensor):
        if beta.shape != logp.shape[:1] or not bool(torch.all(torch.isfinite(beta) & (beta >= 0))):
            raise ValueError(f"beta must be a number >= 0 or a tensor of shape "
                             f"{tuple(logp.shape[:1])} (one weight per sequence) of finite "
                             f"numbers >= 0, got shape {tuple(beta.shape)}")
        penalised = bool(torch.any(beta > 0))
        weight = beta.to(logp.dtype).unsqueeze(1)
    else:
        _check_real("beta", beta, 0.0, math.inf)
        penalised, weight = beta > 0, beta
    mix = _anchor_of(alpha, anchor)
    _check_choice("kl", kl, tuple(_ESTIMATORS))
    if logp.ndim != 2:
        raise ValueError(f"logp must have shape (batch, tokens), got {tuple(logp.shape)}")
    if prev_logp.shape != logp.shape:
        raise ValueError(f"prev_logp must have shape {tuple(logp.shape)}, got "
                         f"{tuple(prev_logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must have shape {tuple(logp.shape[:1])}, got "
                         f"{tuple(advantages.shape)}")
    needs_ref = penalised and mix.weight("reference") > 0
    if needs_ref and (ref_logp is None or ref_logp.shape != logp.shape):
        shape = None if ref_logp is None else tuple(ref_logp.shape)
        raise ValueError(f"ref_logp must have shape {tuple(logp.shape)} when beta > 0 and "
                         f"alpha > 0, got {shape}")
    ratio = torch.exp(logp - prev_logp)
    adv = advantages.unsqueeze(1)
    surrogate = ratio * adv
    if bounds is not None:
        low, high = bounds
        surrogate = torch.minimum(surrogate, torch.clamp(ratio, low, high) * adv)
    clipped = clipped_tokens(logp.detach(), prev_logp, advantages, clip_eps_low=clip_eps_low,
                             clip_eps_high=clip_eps_high)
    loss = -surrogate
    if penalised:
        penalty = anchor_penalty(mix, {
            "reference": lambda: kl_penalty(logp, ref_logp, kl, prev_logp),
            "prev": lambda: kl_penalty(logp, prev_logp, kl, prev_logp)}, loss)
        loss = loss + weight * penalty
    return loss, clipped


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to a scalar, as TRL's ``loss_type`` options do.

    TRL 1.16 defaults to ``loss_type="dapo"``; TRL 1.16's other loss types (cispo,
    sapo, luspo, vespo) change the surrogate itself and are not reproduced.

    - ``"grpo"``: average the tokens of each sequence, then average the
      sequences (DeepSeekMath's formula; long sequences weigh less per token).
    - ``"bnpo"``: sum over all unmasked tokens of the batch divided by their
      number.
    - ``"dr_grpo"``: sum over all unmasked tokens divided by
      ``batch * max_completion_length`` (Dr. GRPO's constant normaliser;
      ``max_completion_length=None`` uses the number of token columns).
    - ``"dapo"``: sum over all unmasked tokens divided by their number. TRL
      counts the tokens across every process of a distributed run; this
      single-process version therefore equals ``"bnpo"`` here.
    """
    _check_choice("loss_type", loss_type, LOSS_TYPES)
    if mask.shape != per_token.shape:
        raise ValueError(f"mask must have shape {tuple(per_token.shape)}, got "
                         f"{tuple(mask.shape)}")
    mask = mask.to(per_token.dtype)
    masked = per_token * mask
    if loss_type == "grpo":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):
        return masked.sum() / mask.sum().clamp(min=1.0)
    length = per_token.shape[1] if max_completion_length is None else max_completion_length
    if isinstance(length, bool) or not isinstance(length, int) or length < per_token.shape[1]:
        raise ValueError(f"max_completion_length must be an int >= the number of token columns "
                         f"({per_token.shape[1]}), got {max_completion_length!r}")
    return masked.sum() / (per_token.shape[0] * length)


def grpo_loss(
    logp: torch.Tensor,
    prev_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps_low: float | None = 0.2,
    clip_eps_high: float | None = None,
    beta: float | torch.Tensor = 0.0,
    kl: str = "k3",
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    alpha: float = 1.0,
    tabular: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    anchor: Anchor | None = None,
) -> torch.Tensor:
    """The GRPO loss of Algorithm 1, line 10, as a scalar to minimise.

    :func:`per_token_loss` followed by :func:`aggregate`; see both for the
    options. With ``clip_eps_low=None``, ``beta > 0``, ``kl="k3_ratio"`` it is a
    sample estimate of the negated (GRPO-No-Clip) objective of Section 2.3.

    ``kl="exact"`` (tabular policies only) replaces the per-token KL estimate by
    the exact KL anchor of eq. (17), averaged over the batch's prompts:
    ``tabular = (logp_all, ref_logp_all, prev_logp_all)`` are the log-probabilities
    ``(n_prompts, n_outputs)`` of every output of those prompts under the policy
    (differentiable), pi_ref and pi_prev, and the loss is the aggregated clipped
    surrogate plus ``beta * (alpha * KL(pi||pi_ref) + (1 - alpha) * KL(pi||pi_prev))``
    (:func:`anchor_penalty`, :func:`tabular_kl`); ``ref_logp`` is then unused and
    ``beta`` must be a number. ``anchor`` (a :class:`~grpo_companion.theory.Anchor`)
    may replace ``alpha``, as in :func:`per_token_loss`.
    """
    if kl != "exact":
        per_token, _ = per_token_loss(
            logp, prev_logp, ref_logp, advantages, clip_eps_low=clip_eps_low,
            clip_eps_high=clip_eps_high, beta=beta, kl=kl, alpha=alpha, anchor=anchor,
        )
        return aggregate(per_token, mask, loss_type=loss_type,
                         max_completion_length=max_completion_length)
    if isinstance(beta, torch.Tensor):
        raise ValueError("beta must be a number with kl='exact' (one weight for the exact KL), "
                         f"got a tensor of shape {tuple(beta.shape)}")
    _check_real("beta", beta, 0.0, math.inf)
    mix = _anchor_of(alpha, anchor)
    if beta > 0 and (tabular is None or len(tabular) != 3):
        raise ValueError("tabular must be (logp_all, ref_logp_all, prev_logp_all) with "
                         f"kl='exact' and beta > 0, got {tabular!r}")
    surrogate, _ = per_token_loss(logp, prev_logp, None, advantages, clip_eps_low=clip_eps_low,
                                  clip_eps_high=clip_eps_high)
    loss = aggregate(surrogate, mask, loss_type=loss_type,
                     max_completion_length=max_completion_length)
    if beta > 0:
        assert tabular is not None
        current, ref_all, prev_all = tabular
        if current.dim() != 2 or ref_all.shape != current.shape or prev_all.shape != current.shape:
            raise ValueError("tabular must hold three (prompts, outputs) log-probability tables "
                             f"of one shape, got {tuple(current.shape)}, {tuple(ref_all.shape)} "
                             f"and {tuple(prev_all.shape)}")
        penalty = anchor_penalty(mix, {"reference": lambda: tabular_kl(current, ref_all).mean(),
                                       "prev": lambda: tabular_kl(current, prev_all).mean()},
                                 loss)
        loss = loss + beta * penalty
    return loss


def tabular_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Exact KL(p||q) = sum_o p(o) (log p(o) - log q(o)) over the last axis.

    Log-probabilities must be finite (the tabular policies use a large
    negative logit, not ``-inf``, for zero-probability outputs, so that
    ``0 * log 0`` terms vanish without NaN).
    """
    return (logp.exp() * (logp - logq)).sum(dim=-1)


def exact_objective(
    logp: torch.Tensor,
    success: torch.Tensor,
    w_plus: torch.Tensor,
    w_minus: torch.Tensor,
    *,
    beta: float,
    ref_logp: torch.Tensor,
    prev_logp: torch.Tensor,
    alpha: float = 1.0,
    anchor: Anchor | None = None,
) -> torch.Tensor:
    """Exact per-prompt objective of the GRPO iterations, eq. (6), (9) and (17).

    ``J(pi) = w+ * P_pi(success) - w- * P_pi(failure)
    - beta * (alpha * KL(pi||pi_ref) + (1 - alpha) * KL(pi||pi_prev))``,
    i.e. the expectation over outputs of the calibrated reward (eq. (4) or
    (13)) with every sample average replaced by its exact value.

    Parameters
    ----------
    logp, ref_logp, prev_logp
        Log-probabilities ``(n_prompts, n_outputs)`` of the policy, the
        reference and the previous iterate.
    success
        Boolean ``(n_prompts, n_outputs)``: which outputs the verifier accepts.
    w_plus, w_minus
        Calibration weights ``(n_prompts,)`` computed from the previous PoS.
    alpha, anchor
        The KL anchor: its reference share, or a :class:`~grpo_companion.theory.Anchor`
        (then ``alpha`` is left at 1.0); the penalty is :func:`anchor_penalty`.

    Returns
    -------
    torch.Tensor
        ``J`` per prompt, shape ``(n_prompts,)``; concave in the logits.
    """
    probs = logp.exp()
    p_success = (probs * success).sum(dim=-1)
    p_failure = (probs * ~success).sum(dim=-1)
    value = w_plus * p_success - w_minus * p_failure
    penalty = anchor_penalty(_anchor_of(alpha, anchor),
                             {"reference": lambda: tabular_kl(logp, ref_logp),
                              "prev": lambda: tabular_kl(logp, prev_logp)}, value)
    return value - beta * penalty
