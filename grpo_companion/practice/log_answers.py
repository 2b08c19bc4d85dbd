"""The theory's answers to what practitioners ask of their GRPO logs (chapter 12).

Each function computes one answer exactly, on the bandit of the paper (one prompt,
outputs that are verified or not) with groups of ``G``:

- :func:`beta0_drift` and :func:`beta0_tail`: with ``beta = 0`` the expected logit
  gradient of GRPO's loss on policy, ``D(p) = E[(k / G) plus[k]]`` over the number of
  successes ``k ~ Binomial(G, p)`` (``plus[k]`` the advantage of a success, from the
  calibration's group table). It vanishes at ``p = 0`` (absorbing) and like
  ``c (1 - p)`` at ``p = 1``, with ``c = (G - 1) plus[G - 1]``: gradient flow
  ``dL/dt = eta D`` then gives ``1 - p(t) ~ 1 / (eta c t)``, an approach to PoS 1 that
  is algebraic, not geometric;
- :func:`kl_on_mixed_groups_fixed_point`: where a prompt would settle if the KL term
  acted only in groups whose rewards differ (the paper's objective, eq. 6, penalises
  every prompt's KL; TRL's loss does so too);
- :func:`softmax_expected_gradient`: the exact expected gradient, in the logits of a
  tabular softmax over several outputs, of GRPO's loss on policy (sampled training
  in expectation), with the forward-KL penalty; :func:`correct_share_entropy` the
  entropy of the policy among the verified outputs, and :func:`expected_gradient_flow`
  the ascent along that gradient from the reference (chapter 12, section 7).

Each is checked against TRL's own code in ``tests/practice/test_log_answers.py``
(:class:`~grpo_companion.practice.trl_bandit.TRLBandit`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize, stats

from grpo_companion import theory
from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.finite_group import group_table
from grpo_companion.validation import check_count

__all__ = [
    "beta0_drift",
    "beta0_tail",
    "correct_share_entropy",
    "expected_gradient_flow",
    "kl_on_mixed_groups_fixed_point",
    "softmax_expected_gradient",
]


def _group(calibration: Calibration) -> int:
    if not isinstance(calibration, Calibration) or calibration.group_size is None:
        raise ValueError(f"calibration must be a theory.Calibration with group_size set "
                         f"(finite groups), got {calibration!r}")
    return int(calibration.group_size)


def _pmf(p: np.ndarray, g: int) -> np.ndarray:
    return stats.binom.pmf(np.arange(g + 1), g, np.asarray(p, dtype=np.float64)[..., None])


def beta0_drift(p: Any, calibration: Calibration) -> np.ndarray:
    """``D(p) = E[(k/G) plus[k]]``: minus the expected gradient of GRPO's loss in the success
    logit, on policy, with no KL term (bandit, one token per completion).

    A group's loss is ``-(1/G) sum_i A_i ratio_i``; at ratio 1 its gradient in ``L`` is
    ``-(1/G) sum_i A_i (r_i - p)`` and, since a group's advantages sum to zero, that is
    ``-(k/G) plus[k]``.
    """
    g = _group(calibration)
    p = np.asarray(p, dtype=np.float64)
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError("p must be probabilities in [0, 1]")
    plus, _ = group_table(calibration, g)
    k = np.arange(g + 1)
    return np.sum(_pmf(p, g) * (k / g) * plus, axis=-1)


def beta0_tail(calibration: Calibration) -> float:
    """``c = lim_{p -> 1} D(p) / (1 - p) = (G - 1) plus[G - 1]`` (see :func:`beta0_drift`)."""
    g = _group(calibration)
    plus, _ = group_table(calibration, g)
    return float((g - 1) * plus[g - 1])


def kl_on_mixed_groups_fixed_point(p_ref: Any, beta: float,
                                   calibration: Calibration) -> np.ndarray:
    """Fixed point if the KL term acted only in groups whose rewards are not all equal.

    A completion's KL term then counts only when the rest of its group holds the other
    outcome: with probability ``m_s = 1 - p^(G-1)`` for a success and
    ``m_f = 1 - (1 - p)^(G-1)`` for a failure. The on-policy expected gradient of the
    bias-corrected k3 becomes that of ``sum_y pi(y) m_y k3(y)``, and the stationary
    point (where the recurrence's fixed points lie) solves

        Omega_G(p) = beta (m_s log(p / p_ref) - m_f log((1 - p) / (1 - p_ref)))

    instead of Theorem 2's ``Omega_G(p) = beta (L - L_ref)`` (``m = 1``). Solved per
    prompt by Brent's method in the logit, on ``[L_ref, L_ref + 1400]``.
    """
    g = _group(calibration)
    if not (isinstance(beta, (int, float)) and beta > 0 and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    p_ref = np.atleast_1d(np.asarray(p_ref, dtype=np.float64))
    if not np.all((p_ref > 0) & (p_ref < 1)):
        raise ValueError("p_ref must be probabilities in (0, 1)")
    out = np.empty(p_ref.size)
    for i, pr in enumerate(p_ref):
        l_ref = float(theory.logit(pr))
        log_pr, log_qr = math.log(pr), math.log1p(-pr)

        def gap(x: float, log_pr: float = log_pr, log_qr: float = log_qr) -> float:
            log_p, log_q = -float(np.logaddexp(0.0, -x)), -float(np.logaddexp(0.0, x))
            m_s, m_f = -math.expm1((g - 1) * log_p), -math.expm1((g - 1) * log_q)
            anchor = m_s * (log_p - log_pr) - m_f * (log_q - log_qr)
            return float(calibration.omega_of_logit(x)) - beta * anchor

        root = optimize.brentq(gap, l_ref, l_ref + 1400.0, xtol=1e-12, rtol=1e-15)
        out[i] = float(theory.sigmoid(root))
    return out


def softmax_expected_gradient(theta: Any, theta_ref: Any, correct: Any,
                              calibration: Calibration, beta: float) -> np.ndarray:
    """Exact expected ascent direction of GRPO on a tabular softmax, on policy.

    Outputs ``a`` with logits ``theta``, verified where ``correct``; groups of ``G``
    sampled from ``pi = softmax(theta)``, one token per completion, loss
    ``-(1/G) sum_i A_i ratio_i`` plus ``beta`` times the forward KL (whose on-policy
    expected gradient TRL's bias-corrected k3 has). Minus the expected gradient is
    ``D(p) pi_a / p`` on a verified output, ``-D(p) pi_b / (1 - p)`` on a failed one
    (``D`` from :func:`beta0_drift`, ``p`` the PoS), minus
    ``beta pi_a (log(pi_a / pi_ref_a) - KL)``.

    The advantage part grows a verified output's logit in proportion to its
    probability, so the likelier of two verified outputs gains on the other: the
    ratios among verified outputs drift, which the closed-form optimum (Theorem 1)
    does not do.
    """
    theta = np.asarray(theta, dtype=np.float64)
    theta_ref = np.asarray(theta_ref, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if theta.ndim != 1 or theta.shape != theta_ref.shape or theta.shape != correct.shape:
        raise ValueError("theta, theta_ref and correct must be 1-D arrays of one length")
    if not (correct.any() and (~correct).any()):
        raise ValueError("correct must mark at least one verified and one failed output")
    pi = np.exp(theta - np.logaddexp.reduce(theta))
    log_ref = theta_ref - np.logaddexp.reduce(theta_ref)
    p = float(pi[correct].sum())
    d = float(beta0_drift(p, calibration))
    ascent = np.where(correct, d * pi / p, -d * pi / (1.0 - p))
    if beta:
        log_ratio = np.log(pi) - log_ref
        ascent = ascent - beta * pi * (log_ratio - float(np.sum(pi * log_ratio)))
    return ascent


def correct_share_entropy(theta: Any, correct: Any) -> float:
    """Entropy (nats) of the policy renormalised on the verified outputs."""
    theta = np.asarray(theta, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    t = theta[correct]
    q = np.exp(t - np.logaddexp.reduce(t))
    return float(-np.sum(q * np.log(q)))


def expected_gradient_flow(theta_ref: Any, correct: Any, calibration: Calibration,
                           beta: float, n_steps: int = 3000, eta: float = 0.1,
                           pair: tuple[int, int] = (0, 1),
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ascent along :func:`softmax_expected_gradient` from the reference, step by step.

    ``theta_{n+1} = theta_n + eta g(theta_n)`` from ``theta_0 = theta_ref``, with ``g`` the
    exact expected on-policy ascent direction of GRPO's loss (sampled training in
    expectation, forward-KL weight ``beta``; ``beta = 0``: no KL), for ``n_steps`` steps.
    Returns three arrays of length ``n_steps + 1`` (the start first): the ratio
    ``pi(a) / pi(b)`` of the two outputs ``pair = (a, b)``, the entropy among the verified
    outputs (:func:`correct_share_entropy`) and the PoS ``pi(verified)``. Theorem 1's
    optimum keeps the ratio of two verified outputs at the reference's; this flow shows
    that sampled training moves it (rank bias), and that with ``beta > 0`` it comes back.
    """
    theta_ref = np.asarray(theta_ref, dtype=np.float64)
    n_steps = check_count("n_steps", n_steps, 0)
    if not (isinstance(eta, int | float) and not isinstance(eta, bool) and eta > 0
            and math.isfinite(eta)):
        raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
    if not (isinstance(beta, int | float) and not isinstance(beta, bool) and beta >= 0
            and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    if not (isinstance(pair, tuple | list) and len(pair) == 2):
        raise ValueError(f"pair must be two output indices (a, b), got {pair!r}")
    a, b = (check_count("pair", i, 0, theta_ref.size - 1) for i in pair)
    theta = theta_ref.copy()
    ratio, entropy, pos = [], [], []
    for _ in range(n_steps + 1):
        pi = np.exp(theta - np.logaddexp.reduce(theta))
        ratio.append(pi[a] / pi[b])
        entropy.append(correct_share_entropy(theta, correct))
        pos.append(pi[np.asarray(correct, dtype=bool)].sum())
        theta = theta + eta * softmax_expected_gradient(theta, theta_ref, correct, calibration,
                                                        beta)
    return np.array(ratio), np.array(entropy), np.array(pos)
