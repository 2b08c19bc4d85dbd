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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_beta,
    check_count,
    check_logit,
    check_probability,
    check_probability_vector,
    check_real,
    check_scalar_array,
    check_success_mask,
)

from .calibration import Calibration, resolve_calibration
from .normalizations import NORMALIZATIONS, Ops, register_normalization
from .policies import optimal_policy, policy_iterate
from .roots import scan_roots

__all__ = [
    "SAMPLE_VARIANTS",
    "VARIANT_SCALES",
    "TrainingPath",
    "calibrated_advantage",
    "expected_gradient_training",
    "log_fail_at_k",
    "log_ratio_drift",
    "negative_only_gains",
    "pass_at_k",
    "pass_at_k_of_logit",
    "positive_only_gains",
    "register_sample_variants",
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
    with ``k`` successes gets ``+plus(k, n)`` of ``"mean_std"``, a failure 0. In the
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
    b = float(check_real("beta", beta, 0.0, scalar=True))
    step = float(check_real("lr", lr, 0.0, open_low=True, scalar=True))
    n_rounds = check_count("n_rounds", n_rounds, 0)
    mu = check_count("mu", mu, 1)
    gamma = float(check_real("unlikeliness", unlikeliness, 0.0, scalar=True))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if pair is None:
        correct = np.flatnonzero(mask)
        order = correct[np.argsort(-ref[correct], kind="stable")]
        pair = (int(order[0]), int(order[-1]))
    else:
        if len(pair) != 2:
            raise ValueError(f"pair must be two output indices (a, b), got {pair!r}")
        pair = (check_count("pair[0]", pair[0], 0, ref.size - 1),
                check_count("pair[1]", pair[1], 0, ref.size - 1))
    a_idx, b_idx = pair
    if not (mask[a_idx] and mask[b_idx]) or ref[a_idx] == ref[b_idx]:
        raise ValueError("pair must be two correct outputs of unequal pi_ref, got "
                         f"{pair!r} with pi_ref {ref[list(pair)]!r}")
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
