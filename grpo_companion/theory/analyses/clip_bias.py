"""Clipping bias under random rewards, computed exactly on a tabular bandit (issue 24 item 6).

Shao et al. (arXiv 2506.10947, "Spurious Rewards: Rethinking Training Signals in
RLVR") observe that GRPO trained on rewards drawn independently of the output
still moves the policy, and attribute the drift to the PPO clip. This module
computes that drift exactly on the smallest model where the question makes
sense: a tabular softmax policy ``pi_z = softmax(z)`` over ``K`` outputs.

One GRPO round from ``pi_old = softmax(z_old)``:

1. sample a group ``o_1, ..., o_G`` i.i.d. from ``pi_old``;
2. draw rewards ``r_i ~ Bernoulli(p)`` i.i.d., **independent of the outputs**;
3. whiten them inside the group with the library's own group advantages
   (:func:`~grpo_companion.theory.group_advantages`; default the paper's eq. (4),
   ``(r - mean) / sqrt(var + eps)``; a group of equal rewards gets 0);
4. take ``mu`` plain gradient-ascent steps of size ``lr`` on the logits ``z`` of
   the sampled surrogate (no KL, ``beta = 0``; ``pi_old`` fixed during the round)::

       S(z) = (1/G) sum_i min(x_i A_i, clip(x_i, 1 - kappa, 1 + kappa) A_i),
       x_i = pi_z(o_i) / pi_old(o_i),

   whose gradient is ``(1/G) sum_i 1{term i not clipped} A_i x_i (e_{o_i} - pi_z)``
   (``kappa = None``: no clipping, every term active).

:func:`expected_drift` enumerates **every** group exactly: all ``K^G`` output
tuples (probability ``prod_i pi_old(o_i)``) times all ``2^G`` reward vectors
(probability ``p^s (1 - p)^(G - s)``), runs the ``mu`` steps of each
deterministically, vectorised over the ``K^G 2^G`` groups (1296 for ``K = 3``,
``G = 4``), and weights the final policies by their probabilities. It returns
``E[pi_new] - pi_old`` and ``E[z_new - z_old]`` (the gradient sums to zero over
the outputs, so the logits' sum is conserved and their drift is well defined).

What is exact here (tests/theory/test_clip_bias.py). Given the outputs, each
advantage has mean 0 over the rewards (the group advantages sum to 0 and the
rewards are exchangeable), so the **first step's** expected logit update is 0,
clipped or not (the ratios are all 1 at the first step, inside the clip). Two
things are not zero: the softmax is curved, so ``E[softmax(z_old + lr g)]``
differs from ``pi_old`` at order ``lr^2`` even for ``mu = 1``; and for ``mu > 1``
the later gradients depend on the earlier, reward-dependent steps, which gives a
second-order logit drift without clipping; once the ratios reach the clip, which
samples keep a gradient depends on the rewards too.

:func:`sampled_drift` is its Monte Carlo counterpart: it draws ``n_samples``
groups (outputs from ``pi_old``, Bernoulli(``p``) rewards), runs the same round on
each and returns the sample means of ``pi_new - pi_old`` and ``z_new - z_old``
with their standard errors (groups are independent, so the standard error is
the sample standard deviation over ``sqrt(n_samples)``). It scales to group sizes
the enumeration cannot hold, and checks the enumeration (the test: within 4
standard errors for ``mu`` in {1, 4}, with and without clipping).

Findings (``pi_old = (0.9, 0.07, 0.03)``, ``G = 4``, ``p = 1/2``, ``kappa = 0.2``;
issue 24 item 6). The high-prior output's expected probability *falls* after a
round, with or without clipping (e.g. ``-9.9e-3`` clipped and ``-0.123`` unclipped
at ``mu = 10``, ``lr = 1``): under mean-zero noise in the logits the curvature of
the softmax takes mass from the leader. Clipping caps how far a group moves the
policy, so it keeps the leader *higher than no clipping does* (its clipped
drift exceeds the unclipped one at every ``lr`` where the clip acts) without
making the drift positive.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    broadcast_shapes,
    check_count,
    check_memory,
    check_probability,
    check_probability_vector,
    check_real,
    check_scalar_array,
    check_seed,
)

from ..calibration import Calibration, resolve_calibration
from ..group_sampling import group_advantages
from .surrogate import check_clip_eps

#: the most inner steps a round may take (a GRPO round takes a few; a larger count is a typo)
MAX_STEPS = 10**6

__all__ = [
    "ClipDrift",
    "EnumeratedGroups",
    "SampledClipDrift",
    "enumerate_groups",
    "expected_drift",
    "group_round_logits",
    "group_surrogate",
    "group_surrogate_gradient",
    "sampled_drift",
]


# ------------------------------------------------------------------------ checks
def _check_prev_policy(prev_policy: ArrayLike) -> np.ndarray:
    """A single probability vector over ``K >= 2`` outputs, every entry > 0."""
    old = check_probability_vector("prev_policy", prev_policy)
    if old.ndim != 1 or old.size < 2:
        raise ValueError(f"prev_policy must be a single (1-D) probability vector over K >= 2 "
                         f"outputs, got shape {old.shape}")
    if np.any(old <= 0):
        raise ValueError(f"prev_policy must have every entry in (0, 1] (the ratios divide by "
                         f"it), got {float(old[old <= 0][0])!r}")
    return old


def _check_clip(clip_eps: object) -> float | None:
    """``None`` or ``inf`` (no clipping) or a clipping half-width ``>= 0``."""
    return check_clip_eps(clip_eps)


def _check_steps(n_steps: object) -> int:
    """Inner steps of a round, an integer in ``[0, MAX_STEPS]``."""
    return check_count("n_steps", n_steps, 0, MAX_STEPS)


def _check_group(old: np.ndarray, outputs: ArrayLike, advantages: ArrayLike
                 ) -> tuple[np.ndarray, np.ndarray]:
    o = np.asarray(outputs)
    if o.ndim == 0 or o.shape[-1] < 1 or not np.issubdtype(o.dtype, np.integer):
        raise ValueError(f"outputs must be an integer array of output indices with a last "
                         f"axis over the group, got {o.dtype} of shape {o.shape}")
    if np.any((o < 0) | (o >= old.size)):
        raise ValueError(f"outputs must be output indices in [0, {old.size - 1}], "
                         f"got {int(o[(o < 0) | (o >= old.size)].flat[0])!r}")
    a = check_real("advantages", advantages)
    o, a = broadcast(outputs=o, advantages=a)
    return o, a


# ------------------------------------------------------------- per-group kernels
def _terms(z: np.ndarray, log_old: np.ndarray, o: np.ndarray, a: np.ndarray,
           c: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Policy ``pi_z`` (..., K), ratios ``x`` (..., G) and the unclipped-term mask (..., G)."""
    logpi = z - special.logsumexp(z, axis=-1, keepdims=True)
    x = np.exp(np.take_along_axis(logpi, o, axis=-1) - log_old[o])
    if c is None:
        active = np.ones(x.shape, bool)
    else:  # min(x a, clip(x) a) picks x a unless the clipped value is strictly smaller
        active = np.where(a > 0, x <= 1.0 + c, x >= 1.0 - c)
    return np.exp(logpi), x, active


def _gradient(z: np.ndarray, log_old: np.ndarray, o: np.ndarray, a: np.ndarray,
              c: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``dS/dz = (1/G) sum_i active_i A_i x_i (e_{o_i} - pi_z)``, shape (..., K), and ``active``."""
    pi, x, active = _terms(z, log_old, o, a, c)
    coef = np.where(active, a * x, 0.0) / o.shape[-1]          # (..., G)
    k = z.shape[-1]
    onehot = o[..., None] == np.arange(k)                      # (..., G, K)
    grad = np.einsum("...g,...gk->...k", coef, onehot) - coef.sum(-1, keepdims=True) * pi
    return grad, active


def group_surrogate(
    logits: ArrayLike,
    prev_policy: ArrayLike,
    outputs: ArrayLike,
    advantages: ArrayLike,
    clip_eps: float | None = None,
) -> np.ndarray:
    """Sampled clipped surrogate ``S(z) = (1/G) sum_i min(x_i A_i, clip(x_i, 1-c, 1+c) A_i)``.

    ``x_i = softmax(z)(o_i) / pi_old(o_i)``; without clipping (``clip_eps=None``)
    ``S = (1/G) sum_i x_i A_i``. The per-sample PPO objective of GRPO (Shao et al.,
    arXiv 2402.03300) with ``beta = 0``.

    Parameters
    ----------
    logits : array_like, shape (..., K)
        Logits ``z`` of the current policy.
    prev_policy : array_like, shape (K,)
        ``pi_old``, every entry > 0.
    outputs : array_like of int, shape (..., G)
        Sampled output indices of each group.
    advantages : array_like, shape (..., G)
        Advantage of each sample.
    clip_eps : float >= 0 or None
        Clipping half-width ``kappa``; ``None`` or ``inf``: no clipping.

    Returns
    -------
    ndarray, shape (...)
    """
    old = _check_prev_policy(prev_policy)
    c = _check_clip(clip_eps)
    o, a = _check_group(old, outputs, advantages)
    z = _check_logits(logits, old.size)
    z, o, a = _broadcast_batch(z, o, a)
    _, x, _ = _terms(z, np.log(old), o, a, c)
    f = x * a if c is None else np.minimum(x * a, np.clip(x, 1.0 - c, 1.0 + c) * a)
    return f.mean(axis=-1)


def _check_logits(logits: ArrayLike, k: int) -> np.ndarray:
    z = check_real("logits", logits)
    if z.ndim == 0 or z.shape[-1] != k:
        raise ValueError(f"logits must have a last axis of K = {k} outputs, got shape {z.shape}")
    return z


def group_surrogate_gradient(
    logits: ArrayLike,
    prev_policy: ArrayLike,
    outputs: ArrayLike,
    advantages: ArrayLike,
    clip_eps: float | None = None,
) -> np.ndarray:
    """Gradient in the logits of :func:`group_surrogate`, shape (..., K).

    ``dS/dz = (1/G) sum_i 1{term i not clipped} A_i x_i (e_{o_i} - softmax(z))``
    (a clipped term is constant in ``z``). Its entries sum to zero.
    """
    old = _check_prev_policy(prev_policy)
    c = _check_clip(clip_eps)
    o, a = _check_group(old, outputs, advantages)
    z = _check_logits(logits, old.size)
    z, o, a = _broadcast_batch(z, o, a)
    return _gradient(z, np.log(old), o, a, c)[0]


def _broadcast_batch(z: np.ndarray, o: np.ndarray, a: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch = broadcast_shapes(logits=z.shape[:-1], outputs=o.shape[:-1])
    return (np.broadcast_to(z, (*batch, z.shape[-1])),
            np.broadcast_to(o, (*batch, o.shape[-1])),
            np.broadcast_to(a, (*batch, a.shape[-1])))


def _round(log_old: np.ndarray, o: np.ndarray, a: np.ndarray, steps: int, lr: float,
           c: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Logits after ``steps`` steps, and which terms were clipped at some step."""
    z = np.broadcast_to(log_old, (*o.shape[:-1], log_old.size)).copy()
    ever = np.zeros(o.shape, bool)
    for _ in range(steps):
        grad, active = _gradient(z, log_old, o, a, c)
        z += lr * grad
        ever |= ~active & (a != 0)
    return z, ever


def group_round_logits(
    prev_policy: ArrayLike,
    outputs: ArrayLike,
    advantages: ArrayLike,
    *,
    n_steps: int,
    lr: float,
    clip_eps: float | None = None,
) -> np.ndarray:
    """Logits after ``n_steps`` gradient-ascent steps on :func:`group_surrogate` from log pi_old.

    ``z_0 = log pi_old`` and ``z_{t+1} = z_t + lr dS/dz(z_t)`` with ``pi_old``
    held fixed (one GRPO round of ``mu = n_steps`` inner updates, ``beta = 0``).
    Vectorised over the leading axes of ``outputs`` / ``advantages``.

    Returns
    -------
    ndarray, shape (..., K)
        ``z_mu``; ``softmax`` of it is the new policy.
    """
    old = _check_prev_policy(prev_policy)
    c = _check_clip(clip_eps)
    o, a = _check_group(old, outputs, advantages)
    mu = _check_steps(n_steps)
    eta = float(check_real("lr", lr, 0.0, scalar=True))
    return _round(np.log(old), o, a, mu, eta, c)[0]


# ------------------------------------------------------------------ enumeration
@dataclass(frozen=True)
class EnumeratedGroups:
    """Every group of one GRPO round, with its probability.

    Attributes
    ----------
    outputs : ndarray of int, shape (N, G)
        Output tuple of each group (``N = K^G 2^G``).
    rewards, advantages : ndarray, shape (N, G)
        Its 0/1 rewards and their group advantages.
    probability : ndarray, shape (N,)
        ``prod_i pi_old(o_i) p^s (1 - p)^(G - s)``; sums to 1.
    """

    outputs: np.ndarray
    rewards: np.ndarray
    advantages: np.ndarray
    probability: np.ndarray


def enumerate_groups(
    prev_policy: ArrayLike,
    group_size: int,
    p: float = 0.5,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> EnumeratedGroups:
    """All ``K^G`` output tuples times all ``2^G`` reward vectors, rewards independent of outputs.

    ``N = K^G 2^G`` groups: 1296 for ``K = 3``, ``G = 4``; the count grows
    quickly with ``G`` (``check_memory`` refuses what does not fit).

    Outputs are i.i.d. from ``prev_policy``, rewards i.i.d. Bernoulli(``p``); the
    advantages are :func:`~grpo_companion.theory.group_advantages` of the rewards
    (default calibration: the paper's eq. (4)).
    """
    old = _check_prev_policy(prev_policy)
    g = check_count("group_size", group_size, 2)
    qq = float(check_scalar_array("p", check_probability("p", p)))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    k = old.size
    log2_n = g * math.log2(2 * k)  # N = (2K)^G, in logs so that a huge G cannot overflow
    n_bytes = 8.0 * 2.0 ** log2_n * (3 * g + k + 1) if log2_n < 900 else math.inf
    check_memory("group_size", g, n_bytes, "the enumerated groups")
    outs = np.array(list(itertools.product(range(k), repeat=g)), dtype=np.int64)   # (K^G, G)
    rews = np.array(list(itertools.product((0.0, 1.0), repeat=g)))                 # (2^G, G)
    p_out = np.prod(old[outs], axis=-1)
    s = rews.sum(-1)
    p_rew = qq ** s * (1.0 - qq) ** (g - s)
    adv = group_advantages(rews, cal)
    n_o, n_r = outs.shape[0], rews.shape[0]
    return EnumeratedGroups(
        outputs=np.repeat(outs, n_r, axis=0),
        rewards=np.tile(rews, (n_o, 1)),
        advantages=np.tile(adv, (n_o, 1)),
        probability=(p_out[:, None] * p_rew[None, :]).reshape(-1),
    )


@dataclass(frozen=True)
class ClipDrift:
    """Exact expected change of a tabular softmax policy after one GRPO round.

    Attributes
    ----------
    policy_drift : ndarray, shape (K,)
        ``E[pi_new] - pi_old``.
    logit_drift : ndarray, shape (K,)
        ``E[z_new - z_old]`` (``z_old = log pi_old``; sums to 0).
    expected_policy : ndarray, shape (K,)
        ``E[pi_new]``.
    clipped_fraction : float
        Expected fraction of a group's samples whose term was clipped (gradient
        cut) at one step or more of the round; 0 without clipping.
    """

    policy_drift: np.ndarray
    logit_drift: np.ndarray
    expected_policy: np.ndarray
    clipped_fraction: float


def expected_drift(
    prev_policy: ArrayLike,
    *,
    n_steps: int,
    lr: float,
    clip_eps: float | None = 0.2,
    group_size: int = 4,
    p: float = 0.5,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> ClipDrift:
    """Exact ``E[pi_new] - pi_old`` of one GRPO round under rewards independent of the output.

    Enumerates every group (:func:`enumerate_groups`), runs ``n_steps`` (``mu``)
    gradient-ascent steps of size ``lr`` on each group's clipped surrogate
    (:func:`group_round_logits`; ``clip_eps=None`` for none) and averages the new
    policies with the groups' probabilities. The claim tested is Shao et al.'s
    (arXiv 2506.10947): with random rewards the clip biases the update.

    Parameters
    ----------
    prev_policy : array_like, shape (K,)
        ``pi_old``, every entry > 0.
    n_steps : int in [0, 10**6]
        Inner gradient steps per round, ``mu``.
    lr : float >= 0
        Learning rate on the logits.
    clip_eps : float >= 0 or None
        Clipping half-width ``kappa`` (default 0.2); ``None`` or ``inf``: no clipping.
    group_size : int >= 2
        ``G``.
    p : float in [0, 1]
        Probability of reward 1 (the same for every output).
    calibration : Calibration, optional
        Group whitening (default :class:`~grpo_companion.theory.Calibration`, eq. 4).
    """
    old = _check_prev_policy(prev_policy)
    c = _check_clip(clip_eps)
    mu = _check_steps(n_steps)
    eta = float(check_real("lr", lr, 0.0, scalar=True))
    groups = enumerate_groups(old, group_size, p, calibration, **calibration_kwargs)
    log_old = np.log(old)
    z, ever = _round(log_old, groups.outputs, groups.advantages, mu, eta, c)
    w = groups.probability
    expected = w @ special.softmax(z, axis=-1)
    clipped = float(w @ ever.mean(-1))
    return ClipDrift(policy_drift=expected - old, logit_drift=w @ (z - log_old),
                     expected_policy=expected, clipped_fraction=clipped)


@dataclass(frozen=True)
class SampledClipDrift:
    """Monte Carlo estimate of :class:`ClipDrift` from sampled groups (:func:`sampled_drift`).

    Attributes
    ----------
    policy_drift, policy_drift_se : ndarray, shape (K,)
        Sample mean of ``pi_new - pi_old`` over the groups, and its standard error.
    logit_drift, logit_drift_se : ndarray, shape (K,)
        Sample mean of ``z_new - z_old`` (sums to 0), and its standard error.
    clipped_fraction : float
        Mean fraction of a group's samples clipped at one step or more of the round.
    n_samples : int
        Number of groups drawn.
    """

    policy_drift: np.ndarray
    policy_drift_se: np.ndarray
    logit_drift: np.ndarray
    logit_drift_se: np.ndarray
    clipped_fraction: float
    n_samples: int


def sampled_drift(
    prev_policy: ArrayLike,
    *,
    n_steps: int,
    lr: float,
    clip_eps: float | None = 0.2,
    group_size: int = 4,
    p: float = 0.5,
    n_samples: int = 10_000,
    seed: int | np.random.Generator = 0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> SampledClipDrift:
    """Monte Carlo ``E[pi_new] - pi_old`` of one GRPO round under output-independent rewards.

    The sampled counterpart of :func:`expected_drift` (module docstring, steps 1-4):
    ``n_samples`` independent groups, each of ``group_size`` outputs drawn i.i.d.
    from ``prev_policy`` with i.i.d. Bernoulli(``p``) rewards, whitened by
    :func:`~grpo_companion.theory.group_advantages`; each group takes ``n_steps``
    gradient-ascent steps of size ``lr`` on its clipped surrogate
    (:func:`group_round_logits`), all groups at once. Deterministic given ``seed``.

    Parameters
    ----------
    prev_policy : array_like, shape (K,)
        ``pi_old``, every entry > 0.
    n_steps : int in [0, 10**6]
        Inner gradient steps per round, ``mu``.
    lr : float >= 0
        Learning rate on the logits.
    clip_eps : float >= 0 or None
        Clipping half-width ``kappa`` (default 0.2); ``None`` or ``inf``: no clipping.
    group_size : int >= 2
        ``G``.
    p : float in [0, 1]
        Probability of reward 1 (the same for every output).
    n_samples : int >= 2
        Number of groups drawn (the standard errors need two).
    seed : int in [0, 2**64 - 1] or numpy Generator
        Seed of the draws.
    calibration : Calibration, optional
        Group whitening (default :class:`~grpo_companion.theory.Calibration`, eq. 4).
    """
    old = _check_prev_policy(prev_policy)
    c = _check_clip(clip_eps)
    mu = _check_steps(n_steps)
    eta = float(check_real("lr", lr, 0.0, scalar=True))
    g = check_count("group_size", group_size, 2)
    qq = float(check_scalar_array("p", check_probability("p", p)))
    n = check_count("n_samples", n_samples, 2)
    check_seed("seed", seed)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    k = old.size
    # the largest arrays: the one-hot (n, G, K) of a gradient step and the (n, G) groups
    n_bytes = 8.0 * n * g * (k + 6) + 8.0 * n * k * 4
    check_memory("n_samples" if n >= g else "group_size", n if n >= g else g, n_bytes,
                 "the sampled groups")
    rng = np.random.default_rng(seed)
    outs = rng.choice(k, size=(n, g), p=old)
    rewards = (rng.random((n, g)) < qq).astype(np.float64)
    adv = group_advantages(rewards, cal)
    log_old = np.log(old)
    z, ever = _round(log_old, outs, adv, mu, eta, c)
    dz = z - log_old
    dpi = special.softmax(z, axis=-1) - old
    root_n = math.sqrt(n)
    return SampledClipDrift(
        policy_drift=dpi.mean(0), policy_drift_se=dpi.std(0, ddof=1) / root_n,
        logit_drift=dz.mean(0), logit_drift_se=dz.std(0, ddof=1) / root_n,
        clipped_fraction=float(ever.mean()), n_samples=n)
