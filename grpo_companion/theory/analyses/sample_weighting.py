"""Rank bias among correct outputs, and positive versus negative samples (issue 24).

Two claims from other papers, held against the book's one-prompt tabular bandit
(``K`` outputs, a success mask, ``pi_ref``, ``beta`` and the paper's calibration
weights ``w+(p)``, ``w-(p)`` at the current PoS ``p``; Mroueh, arXiv 2503.06639).

**Positive and negative samples** (Zhu et al., *The Surprising Effectiveness of
Negative Reinforcement in LLM Reasoning*, arXiv 2506.01347). GRPO's round
objective ``E_pi[A] - beta KL(pi || pi_ref)`` with ``A = +w+`` on a success and
``-w-`` on a failure is split into its two sample terms, each scaled::

    J_c(pi) = c+ w+ pi(S) - c- w- pi(F) - beta KL(pi || pi_ref)

``(c+, c-) = (1, 0)`` keeps only the positive samples (PSR), ``(0, 1)`` only the
negative ones (NSR), ``(0.1, 1)`` is W-REINFORCE **as taken here**: the paper's
positive weight ``lambda = 0.1`` multiplies the ``w+`` term of the *calibrated*
advantage (Zhu et al. use raw +-1 rewards without normalisation; here both terms
keep the paper's whitening weights), and ``(1, 1)`` is full GRPO (computed by
:func:`~grpo_companion.theory.optimal_policy`). The maximiser is
``pi ∝ pi_ref exp(A_c / beta)`` with ``A_c = c+ w+`` on successes and ``-c- w-``
on failures (Theorem 1's argument), so it multiplies every success by one factor
and every failure by another: the within-class ratios are ``pi_ref``'s, and along
the iteration from ``pi_ref`` the round is a map of ``p`` alone,
``L_n = L_ref + (c+ w+(p_{n-1}) + c- w-(p_{n-1})) / beta`` (logits), the paper's
Theorem 2 with ``Omega`` replaced by ``Omega_c = c+ w+ + c- w-``.

**pass@k** of a policy with PoS ``p`` is ``1 - (1 - p)^k``
(:func:`pass_at_k`, computed as ``-expm1(k log(1 - p))``), a strictly increasing
function of ``p`` for every ``k >= 1``, so in one prompt every variant ranks the
same for every ``k``.

**Rank bias** (He et al., *Rewarding the Unlikely: Lifting GRPO Beyond Distribution
Sharpening*, arXiv 2506.02355). Softmax training ``pi = softmax(z)`` on the
expected gradient of ``J(z) = E_pi[A] - beta KL(pi || pi_ref)``, with ``A`` held
fixed at its current value (a policy gradient), has on logit ``a``::

    dJ/dz_a = pi(a) (A(a) - E_pi[A]) - beta pi(a) (log(pi(a) / pi_ref(a)) - KL(pi || pi_ref))

(:func:`softmax_gradient`). Two correct outputs share ``A``, so their logits move
at rates proportional to ``pi``: the likelier one gains (rank bias), measured by
the drift ``log(pi(a) / pi(b)) - log(pi_ref(a) / pi_ref(b))``
(:func:`log_ratio_drift`). At a stationary point with ``beta > 0``
``A(o) - beta log(pi(o) / pi_ref(o))`` is the same for all ``o``, so ``pi`` is
Theorem 1's tilt of ``pi_ref`` and the drift is 0 again.
:func:`expected_gradient_training` also runs the two proposed fixes: the
unlikeliness reward (defined in :func:`calibrated_advantage`) and ``mu`` gradient
steps per round on the unclipped surrogate with ``pi_old`` fixed at the round's
start, ``E_{pi_old}[(pi / pi_old) A] = E_pi[A]`` with ``A`` frozen at ``pi_old``.

**Sampled training** (:func:`sampled_gradient_training`): groups of ``G`` outputs
drawn from ``pi_old``, 0/1 rewards (optionally He et al.'s rank-based unlikeliness
reward, defined there), the library's group advantages, ``mu`` steps on the sampled
surrogate (optional PPO clip) minus the exact KL, many seeds at once. Its ``mu = 1``
expected update is the expected gradient with the *finite-group* weights
``w+_G, w-_G`` (``Calibration(group_size=G)``), not the population ones.

Measured against the committed expectations (benchmarks/results/
beyond_expectations.md, section 3), with ``pi_ref = (0.15, 0.05, 0.3, 0.3, 0.2)``,
outputs 0 and 1 correct, ``beta = 1``, ``lr = 0.25``, ``G = 8``, 400 rounds, 1000
seeds per run, independent seeds between compared runs (``±`` is one standard
error over seeds; tests/theory/test_sample_weighting.py):

- *same shape as expected-gradient training*: **true**. The mean drift peaks at
  0.607 ± 0.007 (round 25) against 0.603 (round 25) for
  :func:`expected_gradient_training` with ``Calibration(group_size=8)`` (0.657 at
  round 24 with the population weights), and returns: 0.013 ± 0.004 after 400
  rounds (0.002 ± 0.003 at ``lr = 0.125``, 800 rounds).
- *within 3 standard errors of the expected-gradient drift at each logged step*
  (16 steps): **false** at ``lr = 0.25``: the sampled drift sits above it, by
  0.0077 ± 0.0015 averaged over the run, at most 5.6 standard errors (round 100).
  The excess is a sampling effect of order ``lr`` (0.0027 at ``lr = 0.125``, 0.0018
  at 0.0625); at ``lr = 0.125`` every logged step is within 3 standard errors.
- *the unlikeliness reward reduces the peak drift by more than 3 standard errors*:
  **true**. ``gamma = 0.25``: peak 0.535 ± 0.007 (7.3 SE lower); ``0.5``: 0.431 ±
  0.008 (17.6 SE); ``1``: the drift never rises. It also moves the end point: the
  drift settles at -0.30, -0.60, -1.02 (the rarer correct output ends *above* its
  reference share), as in expected-gradient training.
- *more steps per round increase the peak drift per round by more than 3
  standard errors*: **true**. Largest mean gain in one round: 0.044 ± 0.002 at
  ``mu = 1``; 0.088 ± 0.004 at ``mu = 2`` (9.3 SE more); 0.171 ± 0.009 at
  ``mu = 4`` (13.7 SE; 0.107 ± 0.005 with the clip ``kappa = 0.2``). Per round
  the gain scales about like ``mu``; the peak over the run does not grow (0.595 ±
  0.010 at ``mu = 2``, 0.593 ± 0.014 at ``mu = 4``, with ``400 / mu`` rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_logit,
    check_memory,
    check_probability,
    check_probability_vector,
    check_real,
    check_scalar_array,
    check_seed,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration
from ..group_sampling import group_advantages
from ..normalizations import NORMALIZATIONS, Ops, register_normalization
from ..policies import optimal_policy, policy_iterate
from ..roots import scan_roots
from .seed_statistics import paired_difference
from .surrogate import check_clip_eps

__all__ = [
    "SAMPLE_VARIANTS",
    "VARIANT_SCALES",
    "PassAtKCrossover",
    "SampledTrainingPath",
    "TrainingPath",
    "calibrated_advantage",
    "expected_gradient_training",
    "log_fail_at_k",
    "log_ratio_drift",
    "mean_pass_at_k_of_logit",
    "negative_only_gains",
    "pass_at_k",
    "pass_at_k_crossover",
    "pass_at_k_of_logit",
    "positive_only_gains",
    "register_sample_variants",
    "sampled_gradient_training",
    "softmax_gradient",
    "softmax_objective",
    "weighted_fixed_points_logit",
    "weighted_iterate_logit",
    "weighted_policy_iterate",
    "weighted_pos_map_logit",
    "weighted_round_policy",
    "w_reinforce_gains",
]

#: ``(c+, c-)``: the scales of the positive (``w+``) and negative (``w-``) sample terms.
VARIANT_SCALES: dict[str, tuple[float, float]] = {
    "positive": (1.0, 0.0),      # PSR: positive samples only
    "negative": (0.0, 1.0),      # NSR: negative samples only
    "w_reinforce": (0.1, 1.0),   # W-REINFORCE: lambda = 0.1 on the w+ term
    "grpo": (1.0, 1.0),          # full GRPO (Theorem 1)
}


# ------------------------------------------------------------------ helpers
def _scales(variant: object) -> tuple[float, float]:
    """A name of :data:`VARIANT_SCALES` or a pair ``(c+, c-)`` of numbers ``>= 0``."""
    if isinstance(variant, str):
        if variant not in VARIANT_SCALES:
            raise ValueError(f"variant must be one of {tuple(VARIANT_SCALES)!r} or a pair "
                             f"(c_plus, c_minus) of numbers >= 0, got {variant!r}")
        return VARIANT_SCALES[variant]
    try:
        items = tuple(variant)  # type: ignore[call-overload]
    except TypeError as err:
        raise ValueError(f"variant must be one of {tuple(VARIANT_SCALES)!r} or a pair "
                         f"(c_plus, c_minus) of numbers >= 0, got {variant!r}") from err
    if len(items) != 2:
        raise ValueError(f"variant must be a pair (c_plus, c_minus) of numbers >= 0, "
                         f"got {variant!r}")
    c_plus = float(check_real("c_plus", items[0], 0.0, scalar=True))
    c_minus = float(check_real("c_minus", items[1], 0.0, scalar=True))
    return c_plus, c_minus


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x)


def _lse(x: np.ndarray, keepdims: bool = False) -> np.ndarray:
    """``logsumexp`` over the last axis (plain numpy: the training loop calls it often)."""
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))
    return out if keepdims else out[..., 0]


def _pos_logit(log_pi: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``log pi(S) - log pi(F)`` over the last axis (exact near PoS 0 and 1)."""
    with np.errstate(divide="ignore"):
        log_s = _lse(np.where(mask, log_pi, -np.inf))
        log_f = _lse(np.where(mask, -np.inf, log_pi))
    return log_s - log_f


def _log_weighted_round(log_ref: np.ndarray, mask: np.ndarray, logit_prev: np.ndarray,
                        b: np.ndarray, c_plus: float, c_minus: float,
                        cal: Calibration) -> np.ndarray:
    """``log pi`` of the maximiser of ``J_c``: ``log pi_ref + A_c / beta``, normalised.

    Shifted by ``-c+ w+ / beta`` so a success gets 0 and a failure
    ``-Omega_c / beta`` (no ``inf - inf``).
    """
    cal.check_boundary(logit_prev, "pi_prev")
    w_plus, w_minus = cal.weights_of_logit(logit_prev)
    drop = (c_plus * w_plus + c_minus * w_minus)[..., None] / b
    log_pi = log_ref + np.where(mask, 0.0, -drop)
    with np.errstate(divide="ignore"):
        return log_pi - special.logsumexp(log_pi, axis=-1, keepdims=True)


# ------------------------------------------------------- exact round optima
def weighted_round_policy(
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    variant: object = "grpo",
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Exact maximiser of ``c+ w+ pi(S) - c- w- pi(F) - beta KL(pi || pi_ref)`` (module doc).

    ``w+, w-`` are the calibration weights at ``pi_prev``'s PoS (the policy that
    sampled the round). ``variant`` is ``"positive"`` (1, 0), ``"negative"`` (0, 1),
    ``"w_reinforce"`` (0.1, 1: Zhu et al., arXiv 2506.01347, ``lambda = 0.1`` on the
    calibrated ``w+`` term), ``"grpo"`` (1, 1: computed by
    :func:`~grpo_companion.theory.optimal_policy`) or a pair ``(c+, c-)`` of numbers
    ``>= 0``. Probability vectors over the last axis; leading axes broadcast.
    """
    c_plus, c_minus = _scales(variant)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if isinstance(variant, str) and variant == "grpo":
        return optimal_policy(pi_ref, pi_prev, success_mask, beta, calibration=cal)
    ref = check_probability_vector("pi_ref", pi_ref)
    prev = check_probability_vector("pi_prev", pi_prev)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    ref, prev, mask, b = broadcast(pi_ref=ref, pi_prev=prev, success_mask=mask, beta=b)
    logit_prev = _pos_logit(_log(prev), mask)
    return np.exp(_log_weighted_round(_log(ref), mask, logit_prev, b, c_plus, c_minus, cal))


def weighted_policy_iterate(
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    n_rounds: int,
    variant: object = "grpo",
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Policies ``pi_0 = pi_ref, pi_1, ..., pi_n`` of :func:`weighted_round_policy` rounds.

    Shape ``(n_rounds + 1, *policy_shape)``; runs on log-policies. ``"grpo"`` is
    :func:`~grpo_companion.theory.policy_iterate`.
    """
    c_plus, c_minus = _scales(variant)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    n_rounds = check_count("n_rounds", n_rounds, 0)
    if isinstance(variant, str) and variant == "grpo":
        return policy_iterate(pi_ref, success_mask, beta, n_rounds, calibration=cal)
    ref = check_probability_vector("pi_ref", pi_ref)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    ref, mask, b = broadcast(pi_ref=ref, success_mask=mask, beta=b)
    log_ref = _log(ref)
    log_pi = log_ref
    out = [ref]
    for _ in range(n_rounds):
        log_pi = _log_weighted_round(log_ref, mask, _pos_logit(log_pi, mask), b, c_plus,
                                     c_minus, cal)
        out.append(np.exp(log_pi))
    return np.stack(out)


def weighted_pos_map_logit(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    variant: object = "grpo",
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """``L_ref + (c+ w+(p) + c- w-(p)) / beta``: the round as a map of the PoS logit.

    Exact when ``pi_prev / pi_ref`` is constant on each reward class (along the
    iteration from ``pi_ref``); ``"grpo"`` is Theorem 2's map. Broadcasts.
    """
    c_plus, c_minus = _scales(variant)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lp = check_logit("logit_p", logit_p)
    lr = check_logit("logit_p_ref", logit_p_ref)
    b = check_beta(beta)
    lp, lr, b = broadcast(logit_p=lp, logit_p_ref=lr, beta=b)
    w_plus, w_minus = cal.weights_of_logit(lp)
    return (lr + (c_plus * w_plus + c_minus * w_minus) / b)[()]


def weighted_iterate_logit(
    logit_p0: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    n_rounds: int,
    variant: object = "grpo",
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """``L_0, ..., L_n`` of :func:`weighted_pos_map_logit`, shape ``(n_rounds + 1, ...)``."""
    n_rounds = check_count("n_rounds", n_rounds, 0)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    path = [np.asarray(check_logit("logit_p0", logit_p0))]
    for _ in range(n_rounds):
        path.append(np.asarray(weighted_pos_map_logit(path[-1], logit_p_ref, beta, variant,
                                                      calibration=cal)))
    return np.stack(np.broadcast_arrays(*path))


def weighted_fixed_points_logit(
    logit_p_ref: float,
    beta: float,
    variant: object = "grpo",
    *,
    n_grid: int = 4097,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """All fixed points (logits, sorted) of :func:`weighted_pos_map_logit`, scalar inputs.

    Since ``0 <= c+ w+ + c- w- <= (c+ + c-) sup Omega``, every fixed point lies in
    ``[L_ref, L_ref + (c+ + c-) sup Omega / beta]``; ``G(L) = map(L) - L`` is scanned
    there on ``n_grid`` points (even in ``asinh L``) and each sign change is bisected to
    adjacent floats (``theory.roots.scan_roots``). Two roots closer
    than the grid spacing (near a saddle-node) can be missed.
    """
    c_plus, c_minus = _scales(variant)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr = float(check_real("logit_p_ref", logit_p_ref, scalar=True))
    b = float(check_scalar_array("beta", check_beta(beta, "beta")))
    n_grid = check_count("n_grid", n_grid, 3)
    if not np.isfinite(cal.omega_sup):
        raise ValueError("calibration must have a bounded Omega (eps > 0 for population "
                         "whitening) for weighted_fixed_points_logit")
    hi = lr + (c_plus + c_minus) * cal.omega_sup / b + 1.0

    def g(x, cells):
        return weighted_pos_map_logit(x, lr, b, (c_plus, c_minus), calibration=cal) - x

    roots = scan_roots(g, np.array([lr - 1.0]), np.array([hi]), n_grid)[0]
    return roots[~np.isnan(roots)]


# ------------------------------------- the variants as registered normalisations
def _scaled_whitening(succ: Any, fail: Any, n: int | None, cal: Any, ops: Ops,
                      c_plus: float, c_minus: float) -> tuple[Any, Any]:
    plus, minus = NORMALIZATIONS["mean_std"].gains(succ, fail, n, cal, ops)
    return c_plus * plus, c_minus * minus


def positive_only_gains(succ: Any, fail: Any, n: int | None, cal: Any,
                        ops: Ops) -> tuple[Any, Any]:
    """PSR as a normalisation: the paper's whitening (eq. 4) on successes, 0 on failures.

    ``(c+, c-) = (1, 0)`` of :data:`VARIANT_SCALES`: a success in a group of ``n``
    with ``k`` successes gets the gain ``+g+(k, n)`` of ``"mean_std"``, a failure 0. In the
    form :func:`~grpo_companion.theory.register_normalization` takes (runs on numpy
    arrays and SymPy symbols; registered by :func:`register_sample_variants`).
    """
    return _scaled_whitening(succ, fail, n, cal, ops, *VARIANT_SCALES["positive"])


def negative_only_gains(succ: Any, fail: Any, n: int | None, cal: Any,
                        ops: Ops) -> tuple[Any, Any]:
    """NSR as a normalisation: 0 on successes, the paper's whitening (eq. 4) on failures.

    ``(c+, c-) = (0, 1)`` of :data:`VARIANT_SCALES`; see :func:`positive_only_gains`.
    """
    return _scaled_whitening(succ, fail, n, cal, ops, *VARIANT_SCALES["negative"])


def w_reinforce_gains(succ: Any, fail: Any, n: int | None, cal: Any,
                      ops: Ops) -> tuple[Any, Any]:
    """W-REINFORCE as taken here: the whitened success gain times 0.1, the failure's kept.

    ``(c+, c-) = (0.1, 1)`` of :data:`VARIANT_SCALES` (module docstring: Zhu et al.'s
    ``lambda = 0.1`` on the calibrated ``w+`` term); see :func:`positive_only_gains`.
    """
    return _scaled_whitening(succ, fail, n, cal, ops, *VARIANT_SCALES["w_reinforce"])


#: Registered name -> (``gains`` function, key of :data:`VARIANT_SCALES`), for
#: :func:`register_sample_variants`.
SAMPLE_VARIANTS: dict[str, tuple[Any, str]] = {
    "positive_only": (positive_only_gains, "positive"),
    "negative_only": (negative_only_gains, "negative"),
    "w_reinforce": (w_reinforce_gains, "w_reinforce"),
}


def register_sample_variants() -> tuple[str, ...]:
    """Register positive-only, negative-only and W-REINFORCE as normalisations; idempotent.

    Registers each name of :data:`SAMPLE_VARIANTS` with
    :func:`~grpo_companion.theory.register_normalization` unless it is already
    registered with the same ``gains`` function, and returns the names, so that
    ``Calibration(normalization="negative_only")`` (and the trainer's
    ``--normalization``) run the variant. Population weights are ``(c+ w+, c- w-)``
    of eq. (4), finite groups the scaled whitening of the group's own mean and
    standard deviation. Nothing is registered at import: call this first.

    Raises
    ------
    ValueError
        If one of the names is registered with another ``gains`` function.
    """
    for name, (gains, key) in SAMPLE_VARIANTS.items():
        entry = NORMALIZATIONS.get(name)
        if entry is not None:
            if entry.gains is not gains:
                raise ValueError(f"a normalisation named {name!r} is already registered with "
                                 f"another gains function ({entry.gains!r}); unregister it "
                                 "before calling register_sample_variants")
            continue
        c_plus, c_minus = VARIANT_SCALES[key]
        register_normalization(
            name, gains, uses_eps=True, uses_ddof=True,
            summary=(f"GRPO's whitening (eq. 4) with the success gain times {c_plus:g} and "
                     f"the failure gain times {c_minus:g} ({key} samples, issue 24)"))
    return tuple(SAMPLE_VARIANTS)


# ------------------------------------------------------------------ pass@k
def pass_at_k(p: ArrayLike, k: ArrayLike) -> np.ndarray:
    """``pass@k = 1 - (1 - p)^k`` for PoS ``p`` in [0, 1] and ``k >= 0``, broadcast.

    Computed as ``-expm1(k log1p(-p))``: relative accuracy near ``p = 0``
    (``pass@k ≈ k p``). Near ``p = 1`` the failure ``(1 - p)^k`` is only as good as
    ``1 - p`` is; pass a logit to :func:`pass_at_k_of_logit` there.
    """
    pp = check_probability("p", p)
    kk = check_real("k", k, 0.0)
    pp, kk = broadcast(p=pp, k=kk)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_fail = np.where(kk == 0, 0.0, kk * np.log1p(-pp))
    return (-np.expm1(log_fail))[()]


def log_fail_at_k(logit_p: ArrayLike, k: ArrayLike) -> np.ndarray:
    """``log(1 - pass@k) = k log(1 - p) = -k log(1 + e^L)``: strictly decreasing in ``L``.

    Orders policies by pass@k without the ties that rounding ``pass@k`` to 1.0
    creates at large ``k``. ``L = +inf`` gives ``-inf``.
    """
    lp = check_logit("logit_p", logit_p)
    kk = check_real("k", k, 0.0)
    lp, kk = broadcast(logit_p=lp, k=kk)
    with np.errstate(invalid="ignore"):
        return np.where(kk == 0, 0.0, kk * special.log_expit(-lp))[()]


def pass_at_k_of_logit(logit_p: ArrayLike, k: ArrayLike) -> np.ndarray:
    """:func:`pass_at_k` from ``L = logit p``: ``-expm1(k log_expit(-L))``, exact near 0 and 1."""
    return (-np.expm1(log_fail_at_k(logit_p, k)))[()]


def mean_pass_at_k_of_logit(logit_p: ArrayLike, k: ArrayLike) -> np.ndarray:
    """Mean over prompts of the exact pass@k, ``mean_q 1 - (1 - p_q)^k``, at every ``k``.

    ``logit_p`` holds ``L = logit p`` with the prompts on its last axis (leading axes, such
    as seeds, are kept); ``k`` (each ``>= 0``) may have any shape. The result has shape
    ``(*logit_p.shape[:-1], *k.shape)``: the pass@k of a set of prompts, each prompt's
    :func:`pass_at_k_of_logit` averaged with equal weight (the curve of Yue et al.,
    arXiv 2504.13837, computed exactly instead of estimated from samples).
    """
    lp = check_logit("logit_p", logit_p)
    kk = check_real("k", k, 0.0)
    if lp.ndim == 0 or lp.shape[-1] == 0:
        raise ValueError(f"logit_p must have the prompts on a last axis of length >= 1, "
                         f"got shape {lp.shape}")
    return pass_at_k_of_logit(lp.reshape(lp.shape + (1,) * kk.ndim), kk).mean(
        axis=lp.ndim - 1)[()]


class PassAtKCrossover(NamedTuple):
    """Yue et al.'s crossover judged over seeds (:func:`pass_at_k_crossover`).

    ``first_k``: the first ``k`` after ``k[0]`` at which training loses beyond the
    criterion, when it also wins at ``k[0]``, else ``None`` (no crossover); ``win``:
    training gains at ``k[0]`` by more than ``n_se`` standard errors; ``loss``: it loses by
    more than ``n_se`` standard errors at some later ``k``.
    """

    first_k: int | None
    win: bool
    loss: bool


def pass_at_k_crossover(before: ArrayLike, after: ArrayLike, k: ArrayLike,
                        n_se: float = 3.0) -> PassAtKCrossover:
    """Do the pass@k curves before and after training cross (Yue et al., arXiv 2504.13837)?

    ``before`` and ``after`` have shape ``(n_seeds, len(k))`` (``n_seeds >= 2``): a pass@k
    curve per seed, paired by seed (the same reference model); ``k`` is increasing. The
    difference ``after - before`` is averaged over seeds and each mean judged against its
    standard error over seeds (:func:`.seed_statistics.paired_difference`):
    a win at ``k[0]`` is a mean above ``n_se`` standard errors, a loss at a later ``k`` a
    mean below ``-n_se`` standard errors with a non-zero spread. The curves cross when
    both happen. Returns a :class:`PassAtKCrossover`.
    """
    kk = check_real("k", k, 0.0)
    if kk.ndim != 1 or kk.size < 2 or np.any(np.diff(kk) <= 0):
        raise ValueError(f"k must be an increasing 1-D array of at least 2 values >= 0, "
                         f"got shape {kk.shape}")
    a = check_real("after", after)
    if a.ndim != 2 or a.shape[1] != kk.size:
        raise ValueError(f"after must have shape (n_seeds, {kk.size}) for {kk.size} values "
                         f"of k, got {a.shape}")
    n = float(check_real("n_se", n_se, 0.0, scalar=True))
    diff = paired_difference(a, before)
    m, se = diff.mean, diff.standard_error
    win = bool(m[0] > n * se[0])
    lose = (m < -n * se) & (se > 0)
    lose_any = bool(lose[1:].any())
    first = int(kk[1:][lose[1:]][0]) if win and lose_any else None
    return PassAtKCrossover(first_k=first, win=win, loss=lose_any)


# ------------------------------------------------------ softmax training
def log_ratio_drift(pi: ArrayLike, pi_ref: ArrayLike, a: int, b: int) -> np.ndarray:
    """``log(pi(a) / pi(b)) - log(pi_ref(a) / pi_ref(b))`` over the last axis (rank drift)."""
    p = check_probability_vector("pi", pi)
    ref = check_probability_vector("pi_ref", pi_ref)
    p, ref = broadcast(pi=p, pi_ref=ref)
    n = p.shape[-1]
    a = check_count("a", a, 0, n - 1)
    b = check_count("b", b, 0, n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp, lr = np.log(p), np.log(ref)
        return ((lp[..., a] - lp[..., b]) - (lr[..., a] - lr[..., b]))[()]


def _check_advantage(advantage: ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    adv = check_real("advantage", advantage)
    if adv.shape[-1:] != shape[-1:]:
        raise ValueError(f"advantage must have a last axis of {shape[-1]} outputs, "
                         f"got shape {adv.shape}")
    return adv


def _check_training_ref(pi_ref: ArrayLike) -> np.ndarray:
    ref = check_probability_vector("pi_ref", pi_ref)
    if (ref <= 0).any():
        raise ValueError("pi_ref must be > 0 on every output for softmax training "
                         f"(a softmax policy has full support), got {ref!r}")
    return ref


def softmax_objective(z: ArrayLike, pi_ref: ArrayLike, advantage: ArrayLike,
                      beta: ArrayLike) -> np.ndarray:
    """``J(z) = sum_o pi(o) A(o) - beta KL(pi || pi_ref)`` with ``pi = softmax(z)``, ``A`` fixed."""
    zz = check_real("z", z)
    ref = _check_training_ref(pi_ref)
    adv = _check_advantage(advantage, zz.shape)
    b = check_real("beta", beta, 0.0)[..., None]
    log_pi = zz - special.logsumexp(zz, axis=-1, keepdims=True)
    pi = np.exp(log_pi)
    kl = np.sum(pi * (log_pi - np.log(ref)), axis=-1, keepdims=True)
    return (np.sum(pi * adv, axis=-1, keepdims=True) - b * kl)[..., 0][()]


def _gradient(log_pi: np.ndarray, log_ref: np.ndarray, adv: np.ndarray,
              b: np.ndarray) -> np.ndarray:
    pi = np.exp(log_pi)
    log_ratio = log_pi - log_ref
    kl = np.sum(pi * log_ratio, axis=-1, keepdims=True)
    mean_a = np.sum(pi * adv, axis=-1, keepdims=True)
    return pi * ((adv - mean_a) - b * (log_ratio - kl))


def softmax_gradient(z: ArrayLike, pi_ref: ArrayLike, advantage: ArrayLike,
                     beta: ArrayLike) -> np.ndarray:
    """Exact ``dJ/dz`` of :func:`softmax_objective` (``A`` fixed; module docstring).

    ``pi(a) (A(a) - E_pi[A]) - beta pi(a) (log(pi(a) / pi_ref(a)) - KL(pi || pi_ref))``.
    ``beta >= 0`` (0: no KL). Last axis: outputs; leading axes broadcast.
    """
    zz = check_real("z", z)
    ref = _check_training_ref(pi_ref)
    adv = _check_advantage(advantage, zz.shape)
    b = check_real("beta", beta, 0.0)[..., None]
    zz, ref, adv, b = broadcast(z=zz, pi_ref=ref, advantage=adv, beta=b)
    log_pi = zz - special.logsumexp(zz, axis=-1, keepdims=True)
    return _gradient(log_pi, np.log(ref), adv, b)


def _advantage(log_pi: np.ndarray, mask: np.ndarray, gamma: np.ndarray,
               cal: Calibration) -> np.ndarray:
    logit_p = _pos_logit(log_pi, mask)
    w_plus, w_minus = cal.weights_of_logit(logit_p)
    w_plus, w_minus = w_plus[..., None], w_minus[..., None]
    with np.errstate(divide="ignore"):
        log_s = _lse(np.where(mask, log_pi, -np.inf), keepdims=True)
    share = np.exp(np.where(mask, log_pi - log_s, -np.inf))  # pi(o) / pi(S) on successes
    return np.where(mask, w_plus * (1.0 + gamma * (1.0 - share)), -w_minus)


def calibrated_advantage(
    pi: ArrayLike,
    success_mask: ArrayLike,
    *,
    unlikeliness: ArrayLike = 0.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Advantage of each output at the PoS ``p`` of ``pi``: ``+w+(p)`` on a success, ``-w-(p)``.

    With ``unlikeliness = gamma > 0`` a correct output ``o`` gets the bonus
    ``gamma w+(p) (1 - pi(o) / p)``: zero for a sole correct output, larger for the
    less likely of two correct outputs (its share ``pi(o) / pi(S)`` of the success
    mass is smaller). This is a smooth, exact-expectation stand-in for He et al.'s
    rank-based unlikeliness reward (arXiv 2506.02355), which lowers the reward of
    correct samples ranked likely under ``pi``; ``gamma`` in [0, inf).
    """
    p = check_probability_vector("pi", pi)
    mask = check_success_mask(success_mask)
    gamma = check_real("unlikeliness", unlikeliness, 0.0)[..., None]
    cal = resolve_calibration(calibration, **calibration_kwargs)
    p, mask, gamma = broadcast(pi=p, success_mask=mask, unlikeliness=gamma)
    log_pi = _log(p)
    cal.check_boundary(_pos_logit(log_pi, mask), "pi")
    return _advantage(log_pi, mask, gamma, cal)


@dataclass(frozen=True)
class TrainingPath:
    """Per-round record of :func:`expected_gradient_training`.

    ``logits``: ``z`` after each round, shape ``(n_rounds + 1, K)`` (row 0 is
    ``log pi_ref``); ``pos``: the PoS after each round; ``drift``: the rank drift
    ``log(pi(a) / pi(b)) - log(pi_ref(a) / pi_ref(b))`` after each round, with ``a``
    the likelier correct output under ``pi_ref``.
    """

    logits: np.ndarray
    pos: np.ndarray
    drift: np.ndarray
    pair: tuple[int, int]

    @property
    def peak(self) -> float:
        """Largest drift over the run."""
        return float(self.drift.max())

    @property
    def peak_round(self) -> int:
        """Round at which the drift peaks."""
        return int(self.drift.argmax())

    @property
    def final(self) -> float:
        """Drift after the last round."""
        return float(self.drift[-1])

    @property
    def peak_increment(self) -> float:
        """Largest drift gained in one round."""
        return float(np.diff(self.drift).max()) if self.drift.size > 1 else 0.0


def _training_problem(pi_ref: ArrayLike, success_mask: ArrayLike, pair: object
                      ) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Check the one-prompt training problem; default pair: likeliest and least likely correct."""
    ref = _check_training_ref(pi_ref)
    if ref.ndim != 1:
        raise ValueError(f"pi_ref must be one probability vector (1-D), got shape {ref.shape}")
    mask = check_success_mask(success_mask)
    if mask.shape != ref.shape:
        raise ValueError(f"success_mask must have the shape of pi_ref {ref.shape}, "
                         f"got {mask.shape}")
    if mask.sum() < 2 or mask.all():
        raise ValueError("success_mask must mark at least two correct outputs and one "
                         f"failure, got {mask!r}")
    if pair is None:
        correct = np.flatnonzero(mask)
        order = correct[np.argsort(-ref[correct], kind="stable")]
        pair = (int(order[0]), int(order[-1]))
    else:
        try:
            n_pair = len(pair)  # type: ignore[arg-type]
        except TypeError as err:
            raise ValueError(f"pair must be two output indices (a, b), got {pair!r}") from err
        if n_pair != 2:
            raise ValueError(f"pair must be two output indices (a, b), got {pair!r}")
        pair = (check_count("pair[0]", pair[0], 0, ref.size - 1),  # type: ignore[index]
                check_count("pair[1]", pair[1], 0, ref.size - 1))  # type: ignore[index]
    a_idx, b_idx = pair
    if not (mask[a_idx] and mask[b_idx]) or ref[a_idx] == ref[b_idx]:
        raise ValueError("pair must be two correct outputs of unequal pi_ref, got "
                         f"{pair!r} with pi_ref {ref[list(pair)]!r}")
    return ref, mask, (int(a_idx), int(b_idx))


def expected_gradient_training(
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: float,
    lr: float,
    n_rounds: int,
    *,
    mu: int = 1,
    unlikeliness: float = 0.0,
    pair: tuple[int, int] | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> TrainingPath:
    """Softmax training on the exact expected gradient, from ``z = log pi_ref``.

    Each round fixes ``pi_old = softmax(z)`` and its advantage ``A``
    (:func:`calibrated_advantage` at ``pi_old``'s PoS, with the unlikeliness bonus
    if ``unlikeliness > 0``), then takes ``mu`` gradient-ascent steps
    ``z += lr * dJ/dz`` (:func:`softmax_gradient`) on the unclipped surrogate
    ``E_{pi_old}[(pi / pi_old) A] - beta KL(pi || pi_ref) = E_pi[A] - beta KL``.
    ``mu = 1`` recomputes ``A`` every step (plain expected-gradient training).

    Parameters
    ----------
    pi_ref : array_like
        Reference policy over ``K`` outputs, ``> 0`` everywhere (1-D).
    success_mask : array_like
        1/True on correct outputs; at least two correct outputs and one failure.
    beta : float
        KL strength, ``>= 0`` (0: no KL).
    lr : float
        Step size, ``> 0``.
    n_rounds, mu : int
        Rounds (``>= 0``) and gradient steps per round (``>= 1``).
    unlikeliness : float
        ``gamma >= 0`` of the unlikeliness bonus.
    pair : (int, int), optional
        Correct outputs ``(a, b)`` whose drift is tracked; default the likeliest and
        the least likely correct output under ``pi_ref`` (they must differ in
        probability).
    """
    ref, mask, pair = _training_problem(pi_ref, success_mask, pair)
    a_idx, b_idx = pair
    b = float(check_real("beta", beta, 0.0, scalar=True))
    step = float(check_real("lr", lr, 0.0, open_low=True, scalar=True))
    n_rounds = check_count("n_rounds", n_rounds, 0)
    mu = check_count("mu", mu, 1)
    gamma = float(check_real("unlikeliness", unlikeliness, 0.0, scalar=True))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    log_ref = np.log(ref)
    z = log_ref.copy()
    zs = [z.copy()]
    gam = np.asarray(gamma)
    for _ in range(n_rounds):
        log_pi = z - _lse(z)
        adv = _advantage(log_pi, mask, gam, cal)
        for _ in range(mu):
            z = z + step * _gradient(log_pi, log_ref, adv, np.asarray(b))
            log_pi = z - _lse(z)
        zs.append(z.copy())
    logits = np.stack(zs)
    log_pis = logits - special.logsumexp(logits, axis=-1, keepdims=True)
    pos = special.expit(_pos_logit(log_pis, mask))
    drift = (logits[:, a_idx] - logits[:, b_idx]) - (log_ref[a_idx] - log_ref[b_idx])
    return TrainingPath(logits=logits, pos=pos, drift=drift, pair=(a_idx, b_idx))


# ------------------------------------------------------ sampled training
#: normalisations whose advantage of real-valued rewards is defined here (unlikeliness > 0)
_REAL_REWARD_NORMALIZATIONS = ("mean_std", "mean_only", "rloo", "max_abs")


def _real_advantages(r: np.ndarray, cal: Calibration) -> np.ndarray:
    """Group advantages of real rewards (last axis: the group) for a built-in normalisation.

    The same formulas as the registry's ``gains`` on 0/1 rewards: ``(r - mean) /
    scale`` with the calibration's ``eps``, ``eps_placement`` and ``ddof``
    (``"mean_std"``), ``r - mean`` (``"mean_only"``), ``G / (G - 1) (r - mean)``
    (``"rloo"``), ``(r - mean) / max abs(r - mean)`` (``"max_abs"``); a group of
    equal rewards gets 0.
    """
    g = r.shape[-1]
    centred = r - r.mean(axis=-1, keepdims=True)
    flat = np.all(centred == 0, axis=-1, keepdims=True)
    name = cal.normalization
    if name == "mean_only":
        return centred
    if name == "rloo":
        return centred * (g / (g - 1))
    if name == "max_abs":
        top = np.max(np.abs(centred), axis=-1, keepdims=True)
        return np.where(flat, 0.0, centred / np.where(flat, 1.0, top))
    var = np.mean(centred**2, axis=-1, keepdims=True) * (g / (g - cal.ddof))
    scale = np.sqrt(var + cal.eps) if cal.eps_placement == "sqrt" else np.sqrt(var) + cal.eps
    return np.where(flat, 0.0, centred / np.where(flat, 1.0, scale))


@dataclass(frozen=True)
class SampledTrainingPath:
    """Per-round record of :func:`sampled_gradient_training`, one column per seed.

    ``logits``: ``z`` after each round, shape ``(n_rounds + 1, n_seeds, K)`` (row 0:
    the start); ``pos``: the PoS ``pi(S)``, ``(n_rounds + 1, n_seeds)``; ``drift``:
    ``log(pi(a) / pi(b)) - log(pi_ref(a) / pi_ref(b))``, ``(n_rounds + 1, n_seeds)``,
    for ``pair = (a, b)``. The statistics below average over the seeds (independent
    runs); a standard error is the standard deviation over seeds over
    ``sqrt(n_seeds)``.
    """

    logits: np.ndarray
    pos: np.ndarray
    drift: np.ndarray
    pair: tuple[int, int]

    @property
    def n_seeds(self) -> int:
        """Number of independent runs."""
        return int(self.drift.shape[1])

    def _se(self, x: np.ndarray) -> np.ndarray:
        if self.n_seeds < 2:
            return np.full(x.shape[:-1], np.inf)
        return x.std(axis=-1, ddof=1) / np.sqrt(self.n_seeds)

    @property
    def mean_drift(self) -> np.ndarray:
        """Mean drift over the seeds after each round, shape ``(n_rounds + 1,)``."""
        return self.drift.mean(axis=-1)

    @property
    def drift_se(self) -> np.ndarray:
        """Standard error of :attr:`mean_drift` (``inf`` with one seed)."""
        return self._se(self.drift)

    @property
    def mean_pos(self) -> np.ndarray:
        """Mean PoS over the seeds after each round."""
        return self.pos.mean(axis=-1)

    @property
    def peak_round(self) -> int:
        """Round at which the mean drift peaks."""
        return int(self.mean_drift.argmax())

    @property
    def peak(self) -> float:
        """Largest mean drift over the run."""
        return float(self.mean_drift[self.peak_round])

    @property
    def peak_se(self) -> float:
        """Standard error of the mean drift at :attr:`peak_round`."""
        return float(self.drift_se[self.peak_round])

    @property
    def final(self) -> float:
        """Mean drift after the last round."""
        return float(self.mean_drift[-1])

    @property
    def final_se(self) -> float:
        """Standard error of :attr:`final`."""
        return float(self.drift_se[-1])

    @property
    def peak_increment(self) -> float:
        """Largest mean drift gained in one round (0 without rounds)."""
        if self.drift.shape[0] < 2:
            return 0.0
        return float(np.diff(self.drift, axis=0).mean(axis=-1).max())

    @property
    def peak_increment_se(self) -> float:
        """Standard error of :attr:`peak_increment` (at the round where it is largest)."""
        if self.drift.shape[0] < 2:
            return 0.0
        inc = np.diff(self.drift, axis=0)
        return float(self._se(inc)[inc.mean(axis=-1).argmax()])


def sampled_gradient_training(
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: float,
    lr: float,
    n_rounds: int,
    *,
    group_size: int = 8,
    n_seeds: int = 256,
    mu: int = 1,
    unlikeliness: float = 0.0,
    clip_eps: float | None = None,
    pair: tuple[int, int] | None = None,
    z0: ArrayLike | None = None,
    seed: int | np.random.Generator = 0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> SampledTrainingPath:
    """GRPO on sampled groups for the tabular softmax bandit, ``n_seeds`` runs at once.

    The sampled counterpart of :func:`expected_gradient_training`. Each round, in
    every run, with ``pi_old = softmax(z)``:

    1. draw ``G = group_size`` outputs ``o_i`` i.i.d. from ``pi_old``; reward
       ``r_i = 1`` for a correct output, 0 otherwise;
    2. with ``unlikeliness = gamma > 0``, He et al.'s unlikeliness reward (arXiv
       2506.02355) **as taken here**: a correct sample's reward becomes
       ``1 - gamma (G - rank_i) / G``, where ``rank_i`` is the number of correct
       samples of the group that ``pi_old`` finds strictly likelier than ``o_i``
       (0 for the likeliest; copies of one output share a rank). The likeliest
       correct sample loses ``gamma``, a rarer one less; failures keep 0;
    3. advantages ``A_i`` of the group by the calibration (default the paper's
       whitening, eq. 4): for 0/1 rewards
       :func:`~grpo_companion.theory.group_advantages`; for the real rewards of
       step 2 the same formula on real numbers (built-in normalisations only);
    4. ``mu`` gradient-ascent steps ``z += lr dJ/dz`` on the sampled surrogate
       minus the exact KL, ``pi_old`` held fixed::

           J(z) = (1/G) sum_i min(x_i A_i, clip(x_i, 1 - kappa, 1 + kappa) A_i)
                  - beta KL(softmax(z) || pi_ref),      x_i = softmax(z)(o_i) / pi_old(o_i)

       (``clip_eps = kappa``; ``None``: no clip). The surrogate's gradient is
       ``(1/G) sum_i 1{not clipped} A_i x_i (e_{o_i} - pi)``, the KL's
       ``pi (log(pi / pi_ref) - KL)`` (tabular, exact).

    With ``mu = 1`` (every ratio 1) the expected update is the exact expected
    gradient of the paper's round objective with the **finite-group** weights:
    given ``o_i = o`` the advantage's mean is ``+w+_G(p)`` on a correct ``o`` and
    ``-w-_G(p)`` otherwise (``Calibration(group_size=G)``, ``p = pi_old(S)``), and
    the advantages of a group sum to 0, so
    ``E[dz] = lr softmax_gradient(z, pi_ref, A_G, beta)`` with
    ``A_G = calibrated_advantage(pi_old, mask, calibration=Calibration(group_size=G))``
    (tested within 4 standard errors).

    Parameters
    ----------
    pi_ref : array_like
        Reference policy over ``K`` outputs, ``> 0`` everywhere (1-D).
    success_mask : array_like
        1/True on correct outputs; at least two correct outputs and one failure.
    beta : float
        KL strength, ``>= 0`` (0: no KL).
    lr : float
        Step size, ``> 0``.
    n_rounds : int
        Rounds, ``>= 0``.
    group_size : int
        ``G >= 2`` (larger than the calibration's ``ddof``).
    n_seeds : int
        Independent runs, ``>= 1``, trained together (vectorised).
    mu : int
        Gradient steps per round, ``>= 1``.
    unlikeliness : float
        ``gamma`` in [0, 1] (0: off). With ``gamma > 0`` the calibration's
        normalisation must be one of ``"mean_std"``, ``"mean_only"``, ``"rloo"``,
        ``"max_abs"``.
    clip_eps : float or None
        PPO clip half-width ``kappa >= 0``; ``None`` or ``inf``: no clip.
    pair : (int, int), optional
        Correct outputs ``(a, b)`` whose drift is recorded; default the likeliest and
        the least likely correct output under ``pi_ref`` (unequal ``pi_ref``).
    z0 : array_like, optional
        Starting logits (``K`` finite numbers); default ``log pi_ref``.
    seed : int or numpy Generator
        Seed in [0, 2**64 - 1]; the runs are deterministic given it.
    calibration : Calibration, optional
        Or the :class:`~grpo_companion.theory.Calibration` keywords. Its
        ``group_size``, if set, must equal ``group_size``.
    """
    ref, mask, pair = _training_problem(pi_ref, success_mask, pair)
    a_idx, b_idx = pair
    b = float(check_real("beta", beta, 0.0, scalar=True))
    step = float(check_real("lr", lr, 0.0, open_low=True, scalar=True))
    n_rounds = check_count("n_rounds", n_rounds, 0)
    g = check_count("group_size", group_size, 2)
    n_seeds = check_count("n_seeds", n_seeds, 1)
    mu = check_count("mu", mu, 1)
    gamma = float(check_real("unlikeliness", unlikeliness, 0.0, 1.0, scalar=True))
    kappa = check_clip_eps(clip_eps)
    check_seed("seed", seed)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if cal.group_size is not None and cal.group_size != g:
        raise ValueError(f"calibration has group_size={cal.group_size} but group_size={g}; "
                         "pass a calibration with group_size=None or the same size")
    if cal.ddof >= g:
        raise ValueError(f"group_size must exceed the calibration's ddof={cal.ddof}, got {g}")
    if gamma > 0 and cal.normalization not in _REAL_REWARD_NORMALIZATIONS:
        raise ValueError(
            f"unlikeliness > 0 makes the rewards real numbers, defined here for calibration "
            f"normalizations {_REAL_REWARD_NORMALIZATIONS!r}; got calibration normalization "
            f"{cal.normalization!r}")
    k = ref.size
    # stored logits, and the largest per-round arrays (the (n_seeds, G, G) ranks, one-hots)
    n_bytes = 8.0 * n_seeds * ((n_rounds + 1) * (k + 2) + g * (g + k + 8))
    counts = {"n_seeds": n_seeds, "n_rounds": n_rounds, "group_size": g}
    largest = max(("n_seeds", n_seeds), ("n_rounds", n_rounds + 1), ("group_size", g * g),
                  key=lambda item: item[1])[0]  # the parameter that sizes the arrays most
    check_memory(largest, counts[largest], n_bytes, "the runs")
    log_ref = np.log(ref)
    if z0 is None:
        z = np.tile(log_ref, (n_seeds, 1))
    else:
        start = check_real("z0", z0)
        if start.shape != ref.shape:
            raise ValueError(f"z0 must be {k} finite logits (the shape of pi_ref), got shape "
                             f"{start.shape}")
        if not np.all(np.isfinite(start)):
            raise ValueError(f"z0 must be finite logits, got {start!r}")
        z = np.tile(start, (n_seeds, 1))
    rng = np.random.default_rng(seed)
    rows = np.arange(n_seeds)[:, None]
    outputs = np.arange(k)
    zs = np.empty((n_rounds + 1, n_seeds, k))
    zs[0] = z
    for t in range(n_rounds):
        log_old = z - _lse(z, keepdims=True)
        cdf = np.cumsum(np.exp(log_old), axis=-1)
        u = rng.random((n_seeds, g))
        o = np.minimum((u[..., None] >= cdf[:, None, :]).sum(-1), k - 1)     # (S, G)
        correct = mask[o]
        log_old_o = log_old[rows, o]
        if gamma > 0:
            likelier = (correct[:, None, :] & (log_old_o[:, None, :] > log_old_o[..., None]))
            rank = likelier.sum(-1)
            rewards = np.where(correct, 1.0 - gamma * (g - rank) / g, 0.0)
            adv = _real_advantages(rewards, cal)
        else:
            adv = group_advantages(correct.astype(np.float64), cal)
        onehot = o[..., None] == outputs                                     # (S, G, K)
        for _ in range(mu):
            log_pi = z - _lse(z, keepdims=True)
            pi = np.exp(log_pi)
            x = np.exp(log_pi[rows, o] - log_old_o)
            if kappa is None:
                coef = adv * x
            else:
                live = np.where(adv > 0, x <= 1.0 + kappa, x >= 1.0 - kappa)
                coef = np.where(live, adv * x, 0.0)
            coef /= g
            grad = np.einsum("sg,sgk->sk", coef, onehot) - coef.sum(-1, keepdims=True) * pi
            log_ratio = log_pi - log_ref
            kl = np.sum(pi * log_ratio, axis=-1, keepdims=True)
            z = z + step * (grad - b * pi * (log_ratio - kl))
        zs[t + 1] = z
    log_pis = zs - _lse(zs, keepdims=True)
    pos = special.expit(_pos_logit(log_pis, mask))
    drift = (zs[..., a_idx] - zs[..., b_idx]) - (log_ref[a_idx] - log_ref[b_idx])
    return SampledTrainingPath(logits=zs, pos=pos, drift=drift, pair=(a_idx, b_idx))
