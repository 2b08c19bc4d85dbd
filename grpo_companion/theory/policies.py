"""Closed-form optimal policies on a finite outcome space (Theorems 1, 4, 8; Lemmas 2, 3).

Policies are arrays whose last axis runs over outcomes; leading axes batch
prompts. Everything is computed in log space and normalised with logsumexp.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    broadcast,
    check_alpha,
    check_beta,
    check_count,
    check_memory,
    check_probability,
    check_probability_vector,
    check_real,
    check_success_mask,
)

from .calibration import Calibration, resolve_calibration
from .logistic import logit
from .variants import mix_targets, share_pairs

__all__ = [
    "anchored_policy",
    "geometric_anchor",
    "kl_divergence",
    "optimal_policy",
    "policy_iterate",
    "pos",
    "renyi_correction",
    "renyi_divergence",
]


def _log(pi: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(pi)


def _scaled_log(weight: np.ndarray, log_pi: np.ndarray) -> np.ndarray:
    """``weight * log pi`` with ``0 * log 0 = 0`` (so ``pi^0 = 1``)."""
    with np.errstate(invalid="ignore"):
        return np.where(weight == 0, 0.0, weight * log_pi)


def pos(policy: ArrayLike, success_mask: ArrayLike) -> np.ndarray:
    """Probability of success ``sum_o pi(o) 1[r(o) = 1]`` (paper, eq. 7)."""
    pi = check_probability_vector("policy", policy)
    mask = check_success_mask(success_mask)
    pi, mask = broadcast(policy=pi, success_mask=mask)
    # rounding can push the sum of a normalised policy's success mass above 1 by an ulp
    return np.minimum(np.sum(np.where(mask, pi, 0.0), axis=-1), 1.0)


def kl_divergence(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    """``KL(p || q) = sum p log(p / q)`` over the last axis (``inf`` if ``p`` is not << ``q``)."""
    pp = check_probability_vector("p", p)
    qq = check_probability_vector("q", q)
    pp, qq = broadcast(p=pp, q=qq)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(pp > 0, pp * (_log(pp) - _log(qq)), 0.0)
    return np.sum(terms, axis=-1)


def renyi_divergence(p: ArrayLike, q: ArrayLike, order: float) -> np.ndarray:
    """Renyi divergence ``D_a(p || q) = log(sum p^a q^(1-a)) / (a - 1)``, ``0 < a < 1``."""
    a = float(check_real("order", order, 0.0, 1.0, open_low=True, open_high=True,
                         scalar=True))
    pp = check_probability_vector("p", p)
    qq = check_probability_vector("q", q)
    pp, qq = broadcast(p=pp, q=qq)
    log_sum = special.logsumexp(a * _log(pp) + (1 - a) * _log(qq), axis=-1)
    return log_sum / (a - 1)


def geometric_anchor(pi_ref: ArrayLike, pi_prev: ArrayLike, alpha: ArrayLike) -> np.ndarray:
    """Lemma 2: ``anchor ∝ pi_ref^alpha pi_prev^(1-alpha)``.

    ``alpha KL(pi||pi_ref) + (1 - alpha) KL(pi||pi_prev) = KL(pi||anchor) + const``.
    """
    ref = check_probability_vector("pi_ref", pi_ref)
    prev = check_probability_vector("pi_prev", pi_prev)
    a = check_alpha(alpha)[..., None]
    ref, prev, a = broadcast(pi_ref=ref, pi_prev=prev, alpha=a)
    return _geometric_anchor(ref, prev, a)


def _geometric_anchor(ref: np.ndarray, prev: np.ndarray, a: np.ndarray) -> np.ndarray:
    return np.exp(_log_geometric_anchor(_log(ref), _log(prev), a))


def _log_geometric_anchor(log_ref: np.ndarray, log_prev: np.ndarray,
                          a: np.ndarray) -> np.ndarray:
    """``log anchor`` of Lemma 2 from log-policies, normalised.

    The targets' log-probabilities are mixed by the anchor's one rule
    (:func:`~grpo_companion.theory.variants.mix_targets`), with ``0 * log 0 = 0``.
    """
    log_anchor = mix_targets(share_pairs(a), {"reference": log_ref, "prev": log_prev},
                             times=_scaled_log)
    with np.errstate(divide="ignore"):
        norm = special.logsumexp(log_anchor, axis=-1, keepdims=True)
    if np.isneginf(norm).any():
        raise ValueError("pi_ref and pi_prev have disjoint supports: the anchor has no mass")
    return log_anchor - norm


def _pos_logit(log_pi: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logit of the PoS of a log-policy: ``log P(success) - log P(failure)``, exact near 0, 1.

    ``+inf`` (``-inf``) when the failures (successes) have no mass.
    """
    with np.errstate(divide="ignore"):
        log_s = special.logsumexp(np.where(mask, log_pi, -np.inf), axis=-1)
        log_f = special.logsumexp(np.where(mask, -np.inf, log_pi), axis=-1)
    return log_s - log_f


def _check_pos(name: str, logit_nu: np.ndarray, cal: Calibration) -> None:
    """Refuse a given policy with PoS 0 or 1 where Omega is infinite there (eps = 0)."""
    if cal.undefined_at_boundary and np.isinf(logit_nu).any():
        value = float(np.asarray(logit_nu)[np.isinf(logit_nu)].flat[0])
        raise ValueError(
            f"{name} must give mass to successes and to failures (PoS in (0, 1)) when eps=0 "
            "with population whitening (Omega is infinite at PoS 0 and 1); got "
            f"{name} with PoS={1.0 if value > 0 else 0.0!r}")


def anchored_policy(
    anchor: ArrayLike,
    success_mask: ArrayLike,
    p_nu: ArrayLike,
    beta: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Theorem 8: maximiser of ``E_pi[A] - beta KL(pi || anchor)``.

    ``pi* ∝ anchor * exp(A / beta)`` with ``A = +w+(p_nu)`` on successes and
    ``-w-(p_nu)`` on failures; ``p_nu`` is the PoS of the sampling policy.
    """
    anc = check_probability_vector("anchor", anchor)
    mask = check_success_mask(success_mask)
    pn = check_probability("p_nu", p_nu)[..., None]
    b = check_beta(beta)[..., None]
    cal = resolve_calibration(calibration, **calibration_kwargs)
    anc, mask, pn, b = broadcast(anchor=anc, success_mask=mask, p_nu=pn, beta=b)
    logit_nu = logit(pn[..., 0])
    cal.check_boundary(logit_nu, "p_nu")
    return np.exp(_log_anchored_policy(_log(anc), mask, logit_nu, b, cal))


def _log_anchored_policy(log_anc: np.ndarray, mask: np.ndarray, logit_nu: np.ndarray,
                         b: np.ndarray, cal: Calibration) -> np.ndarray:
    """``log pi*`` of Theorem 8 from ``log anchor`` and the logit of the sampler's PoS.

    The softmax is unchanged when every advantage is shifted by ``-w+``, so a
    success gets 0 and a failure ``-Omega / beta``: finite, or ``-inf`` where
    ``Omega / beta`` exceeds float64 (``beta`` near 0, ``eps = 0``), with no
    ``inf - inf``. ``logit_nu = +-inf`` (PoS 1 or 0, reached by an iteration)
    gives the limit of ``p_nu -> 1, 0``.
    """
    with np.errstate(over="ignore", divide="ignore"):
        drop = cal.omega_unchecked(logit_nu)[..., None] / b
        far = ~np.isfinite(drop)
        if far.any():  # Omega itself or Omega / beta beyond float64: from log Omega
            log_om = cal.log_omega_unchecked(logit_nu)[..., None]
            drop = np.where(far, np.exp(log_om - np.log(b)), drop)
    log_pi = log_anc + np.where(mask, 0.0, -drop)
    with np.errstate(divide="ignore"):
        norm = special.logsumexp(log_pi, axis=-1, keepdims=True)
    # an anchor without successes while Omega / beta is infinite: every failure is shifted
    # alike, so the policy is the anchor (the limit of a large finite shift)
    return np.where(np.isneginf(norm), log_anc, log_pi - norm)


def optimal_policy(
    pi_ref: ArrayLike,
    pi_prev: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """One GRPO iteration in policy space (no clipping), eq. (17).

    Maximises ``E_pi[A_{n-1}] - beta (alpha KL(pi||pi_ref) + (1-alpha) KL(pi||pi_prev))``:
    ``alpha = 1`` is Theorem 1, ``alpha = 0`` is Theorem 4, and ``0 < alpha < 1``
    uses the geometric-mean anchor of Lemma 2 in Theorem 8.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    ref = check_probability_vector("pi_ref", pi_ref)
    prev = check_probability_vector("pi_prev", pi_prev)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    a = check_alpha(alpha)[..., None]
    ref, prev, mask, b, a = broadcast(pi_ref=ref, pi_prev=prev, success_mask=mask, beta=b,
                                      alpha=a)
    return _optimal_policy(ref, prev, mask, b, a, cal)


def _optimal_policy(ref: np.ndarray, prev: np.ndarray, mask: np.ndarray, b: np.ndarray,
                    a: np.ndarray, cal: Calibration) -> np.ndarray:
    """:func:`optimal_policy` on checked inputs broadcast to one shape."""
    log_prev = _log(prev)
    logit_prev = _pos_logit(log_prev, mask)
    _check_pos("pi_prev", logit_prev, cal)
    return np.exp(_log_optimal_policy(_log(ref), log_prev, logit_prev, mask, b, a, cal))


def _log_optimal_policy(log_ref: np.ndarray, log_prev: np.ndarray, logit_prev: np.ndarray,
                        mask: np.ndarray, b: np.ndarray, a: np.ndarray,
                        cal: Calibration) -> np.ndarray:
    """``log`` of eq. (17)'s policy from log-policies and the logit of ``pi_prev``'s PoS."""
    log_anchor = _log_geometric_anchor(log_ref, log_prev, a)
    return _log_anchored_policy(log_anchor, mask, logit_prev, b, cal)


def renyi_correction(
    pi_ref: ArrayLike, pi_prev: ArrayLike, success_mask: ArrayLike, alpha: ArrayLike
) -> np.ndarray:
    """Renyi correction ``Delta_R`` of Lemma 3 / Theorem 9 (eq. 23).

    ``Delta_R = (1 - alpha) (D_alpha(ref_F || prev_F) - D_alpha(ref_S || prev_S))``
    where ``ref_S``, ``ref_F`` (``prev_S``, ``prev_F``) are ``pi_ref`` (``pi_prev``)
    conditioned on success / failure. Then
    ``logit PoS(anchor) = alpha L_ref + (1 - alpha) L_prev + Delta_R``. Zero when
    ``pi_prev`` is a reward-class tilt of ``pi_ref`` (e.g. every iterate started
    at ``pi_ref``). Both policies must give mass to successes and to failures.
    """
    ref = check_probability_vector("pi_ref", pi_ref)
    prev = check_probability_vector("pi_prev", pi_prev)
    mask = check_success_mask(success_mask)
    a = check_alpha(alpha)[..., None]
    ref, prev, mask, a = broadcast(pi_ref=ref, pi_prev=prev, success_mask=mask, alpha=a)
    for name, pi in (("pi_ref", ref), ("pi_prev", prev)):
        s = np.sum(np.where(mask, pi, 0.0), axis=-1)
        f = np.sum(np.where(mask, 0.0, pi), axis=-1)
        if ((s <= 0) | (f <= 0)).any():
            raise ValueError(f"{name} must give mass to successes and failures, PoS={s!r}")

    def log_bhattacharyya(cls: np.ndarray) -> np.ndarray:
        # (1 - alpha) D_alpha(P || Q) = -log sum P^alpha Q^(1-alpha) on one reward class
        log_p = np.where(cls, _log(ref), -np.inf)
        log_q = np.where(cls, _log(prev), -np.inf)
        log_p = log_p - special.logsumexp(log_p, axis=-1, keepdims=True)
        log_q = log_q - special.logsumexp(log_q, axis=-1, keepdims=True)
        mixed = mix_targets(share_pairs(a), {"reference": log_p, "prev": log_q},
                            times=_scaled_log)
        terms = np.where(cls, mixed, -np.inf)
        return special.logsumexp(terms, axis=-1)

    out = log_bhattacharyya(mask) - log_bhattacharyya(~mask)
    if np.isnan(out).any():
        raise ValueError("the Renyi correction is undefined: the anchor has no mass")
    return out


def policy_iterate(
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    *,
    alpha: ArrayLike = 1.0,
    pi_0: ArrayLike | None = None,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Policies ``pi_0, ..., pi_n`` of GRPO iterations (eq. 17), ``pi_0 = pi_ref`` by default.

    Returns shape ``(n_steps + 1, *policy_shape)``. The iteration runs on
    log-policies, so it stays finite for every ``beta > 0``: with ``eps = 0``
    and ``beta`` near 0 an iterate whose PoS reaches 1 (failures' mass below
    float64) continues as the limit ``p -> 1`` (the anchor's successes).
    A ``pi_0`` with PoS 0 or 1 is refused when ``eps = 0`` whitening makes
    ``Omega`` infinite there.
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    ref = check_probability_vector("pi_ref", pi_ref)
    current = ref if pi_0 is None else check_probability_vector("pi_0", pi_0)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    a = check_alpha(alpha)[..., None]
    n_steps = check_count("n_steps", n_steps, 0)
    ref, current, mask, b, a = broadcast(pi_ref=ref, pi_0=current, success_mask=mask, beta=b,
                                         alpha=a)
    check_memory("n_steps", n_steps, 8.0 * (n_steps + 1) * current.size, "the policy path")
    # the iteration runs on log-policies: a PoS closer to 1 than float64 resolves keeps its
    # exact logit for the next step's weights (the returned probabilities round it to 1)
    log_ref, log_pi = _log(ref), _log(current)
    _check_pos("pi_ref" if pi_0 is None else "pi_0", _pos_logit(log_pi, mask), cal)
    out = [current]
    for _ in range(n_steps):
        log_pi = _log_optimal_policy(log_ref, log_pi, _pos_logit(log_pi, mask), mask, b, a, cal)
        out.append(np.exp(log_pi))
    return np.stack(out)
