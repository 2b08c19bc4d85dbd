"""Policy entropy under GRPO steps: the covariance identity and the ``R = -a e^H + b`` law.

Cui et al., *The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models* (arXiv 2505.22617), state two things that this module computes
exactly on the book's tabular softmax bandit:

**The covariance identity.** For ``pi = softmax(z)`` with entropy
``H(z) = -sum_a pi(a) log pi(a)``, the gradient is
``dH/dz_a = -pi(a) (log pi(a) + H)``, so a change ``dz`` of the logits changes the
entropy by::

    dH = -Cov_pi(log pi, dz) + O(|dz|^2)                (first order)

(:func:`entropy_change_first_order`); :func:`entropy_change` gives the exact
``H(z + dz) - H(z)``, computed without the cancellation of the plain difference
(module notes of that function), so the remainder can be measured down to tiny
steps.

**One exact-gradient GRPO step** (:func:`grpo_logit_step`). The step ascends, at
the current policy ``pi = softmax(z)``, the objective
``J(z) = E_pi[A] - beta KL(pi || pi_ref)`` with the calibrated advantage ``A = +w+``
on a success and ``-w-`` on a failure, the weights taken at the current PoS
``p = pi(successes)`` and held fixed (the stop-gradient of GRPO's advantages;
:mod:`grpo_companion.theory.calibration`). With the payoff
``c(a) = A(a) - beta log(pi(a) / pi_ref(a))``, ``dJ/dz_a = pi(a) (c(a) - E_pi c)``.
Two geometries are implemented and named:

- ``"plain"`` (vanilla softmax policy gradient): ``dz_a = lr pi(a) (c(a) - E_pi c)``,
  for which Cui et al.'s Lemma reads ``dH ~ -lr Cov_pi(log pi, pi c)``;
- ``"natural"`` (natural policy gradient, the Fisher ``diag(pi) - pi pi^T`` inverted
  on centred logits): ``dz_a = lr (c(a) - E_pi c)``, Cui et al.'s form
  ``dz_a`` proportional to the advantage, ``dH ~ -lr Cov_pi(log pi, c)``.

With ``beta -> 0`` the payoff is the advantage itself. The natural step with
``lr = 1 / beta`` lands exactly on the paper's GRPO iteration
``pi_n ∝ pi_ref exp(A / beta)`` (Mroueh, arXiv 2503.06639, Theorem 1):
``z + (c - E c) / beta = log pi_ref + A / beta + const``.
:func:`step_entropy_covariance` gives the covariance form of the step's entropy
change written from the advantage (not from ``dz``).

**The empirical law.** Cui et al. fit ``R = -a exp(H) + b`` to (entropy,
reward) pairs along training runs. :func:`fit_entropy_laws` fits it and the
simplest alternative with as many constants, ``R = a' H + b'``, by least squares
(both are linear in their constants, so each fit is closed form), and
:func:`compare_entropy_laws` compares their residual mean squares over seeds with
a standard error. :func:`exact_gradient_run` gives the (H, R) pairs of an
exact-gradient run of the bandit from ``pi_ref``, ``R = p`` the expected reward
(the PoS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import (
    as_float_array,
    broadcast,
    check_beta,
    check_choice,
    check_count,
    check_memory,
    check_probability_vector,
    check_real,
    check_success_mask,
)

from ..calibration import Calibration, resolve_calibration

__all__ = [
    "GRADIENTS",
    "EntropyLawComparison",
    "EntropyLawFit",
    "EntropyRun",
    "compare_entropy_laws",
    "entropy",
    "entropy_change",
    "entropy_change_first_order",
    "exact_gradient_run",
    "fit_entropy_laws",
    "grpo_logit_step",
    "step_entropy_covariance",
]

#: The two step geometries of :func:`grpo_logit_step` (module docstring).
GRADIENTS = ("plain", "natural")


# ------------------------------------------------------------------------ checks
def _check_logits(value: ArrayLike, name: str = "logits", *, finite: bool = False) -> np.ndarray:
    """Logits over the last axis: real or ``-inf`` (an output without mass), never ``+inf``
    or NaN, at least one finite per policy. ``finite=True`` refuses ``-inf`` too."""
    valid = "finite logits" if finite else "logits: real numbers or -inf, not all -inf"
    z = as_float_array(name, value, valid)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis of outputs, got shape "
                         f"{z.shape}")
    bad = np.isnan(z) | (z == np.inf) | ((z == -np.inf) if finite else False)
    if bad.any():
        raise ValueError(f"{name} must be {valid}, got {z[bad].flat[0]!r}")
    if not finite and (z == -np.inf).all(axis=-1).any():
        raise ValueError(f"{name} must be {valid}, got a policy with every logit -inf")
    return z


def _check_dz(value: ArrayLike) -> np.ndarray:
    dz = check_real("dz", value)
    if dz.ndim == 0 or dz.shape[-1] == 0:
        raise ValueError(f"dz must have a non-empty last axis of outputs, got shape {dz.shape}")
    return dz


def _pair(z: np.ndarray, dz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z, dz = broadcast(logits=z, dz=dz)
    return z, dz


# ----------------------------------------------------------------- the entropy
def _log_softmax(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(log pi, pi)`` of ``softmax(z)`` over the last axis, accurate also near a vertex.

    ``log Z = m + log1p(sum_{a != argmax} e^{z_a - m})``, so the largest output's
    ``log pi = -log1p(rest)`` keeps its relative accuracy when ``rest`` is tiny.
    """
    m = z.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - m)
    top = np.argmax(z, axis=-1)[..., None]
    np.put_along_axis(e, top, 0.0, axis=-1)
    log_z = m + np.log1p(e.sum(axis=-1, keepdims=True))
    log_pi = z - log_z
    return log_pi, np.exp(log_pi)


def _entropy(log_pi: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """``-sum pi log pi`` with ``0 log 0 = 0``; a sum of non-negative terms."""
    with np.errstate(invalid="ignore"):
        return np.sum(np.where(pi > 0, -pi * log_pi, 0.0), axis=-1)


def entropy(logits: ArrayLike) -> np.ndarray:
    """Shannon entropy ``H = -sum_a pi(a) log pi(a)`` (nats) of ``pi = softmax(logits)``.

    Vectorised over leading axes; the last axis holds the outputs. A logit
    ``-inf`` is an output without mass. Each term ``-pi log pi`` is non-negative
    and computed in log space, so ``H`` is accurate to a few ulps also for a
    policy near a vertex (``H`` tiny) (Cui et al., arXiv 2505.22617, eq. of the
    policy entropy).
    """
    z = _check_logits(logits)
    return _entropy(*_log_softmax(z))[()]


def _centred(pi: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``x - E_pi x`` (outputs without mass contribute nothing to the mean)."""
    return x - np.sum(np.where(pi > 0, pi * x, 0.0), axis=-1, keepdims=True)


def _first_order(log_pi: np.ndarray, pi: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """``-Cov_pi(log pi, dz) = -sum pi (log pi + H)(dz - E dz)`` on checked arrays."""
    h = _entropy(log_pi, pi)[..., None]
    u = _centred(pi, dz)
    with np.errstate(invalid="ignore"):
        return -np.sum(np.where(pi > 0, pi * (log_pi + h) * u, 0.0), axis=-1)


def entropy_change_first_order(logits: ArrayLike, dz: ArrayLike) -> np.ndarray:
    """First-order entropy change ``-Cov_pi(log pi, dz)`` of ``pi = softmax(logits)``.

    The covariance identity of Cui et al. (arXiv 2505.22617, Lemma 1 and its
    tabular softmax derivation): ``dH/dz_a = -pi(a)(log pi(a) + H)``, hence
    ``H(z + dz) = H(z) - Cov_pi(log pi, dz) + O(|dz|^2)``. Invariant under
    ``dz -> dz + const``. ``logits`` and ``dz`` broadcast over leading axes; the
    last axis holds the outputs; ``dz`` must be finite.
    """
    z = _check_logits(logits)
    d = _check_dz(dz)
    z, d = _pair(z, d)
    log_pi, pi = _log_softmax(z)
    return _first_order(log_pi, pi, d)[()]


def _exact_change(z: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """``H(z + dz) - H(z)`` on checked, broadcast arrays (see :func:`entropy_change`)."""
    log_p, p = _log_softmax(z)
    live = p > 0
    u = np.where(live, _centred(p, dz), 0.0)
    small = np.abs(u).max(axis=-1, keepdims=True) <= 1.0
    us = np.where(small, u, 0.0)  # the expansion is only used (and safe) where |u| <= 1
    # c' = log E_p e^u = log1p(E_p expm1(u)), second order in u
    c = np.log1p(np.sum(np.where(live, p * np.expm1(us), 0.0), axis=-1, keepdims=True))
    pr = np.where(live, p * np.expm1(us - c), 0.0)  # p (q / p - 1) = q - p
    h = _entropy(log_p, p)[..., None]
    with np.errstate(invalid="ignore"):
        first = -np.sum(np.where(live, pr * (log_p + h), 0.0), axis=-1)
    second = -np.sum(pr * us, axis=-1) + c[..., 0]
    series = first + second
    with np.errstate(invalid="ignore"):
        shifted = z + dz  # -inf stays -inf
    direct = _entropy(*_log_softmax(shifted)) - h[..., 0]
    return np.where(small[..., 0], series, direct)


def entropy_change(logits: ArrayLike, dz: ArrayLike) -> np.ndarray:
    """The exact entropy change ``H(logits + dz) - H(logits)`` of a softmax policy.

    For steps with ``max_a |dz_a - E_pi dz| <= 1`` it is computed without the
    cancellation of the plain difference: with ``u = dz - E_p dz``,
    ``c' = log E_p e^u`` and ``q = softmax(z + dz) = p e^{u - c'}``,
    ``H(q) - H(p) = -E_p[r (log p + H(p))] - E_p[r u] + c'`` with
    ``r = q / p - 1 = expm1(u - c')``, each term accurate to a few ulps relative to
    its own size (the first is the first-order change, the other two are
    ``O(|u|^2)``). Larger steps use the plain difference, accurate to a few ulps of
    ``H``. Broadcasting as :func:`entropy_change_first_order`.
    """
    z = _check_logits(logits)
    d = _check_dz(dz)
    return _exact_change(*_pair(z, d))[()]


# ------------------------------------------------------- one GRPO gradient step
def _check_pi_ref(pi_ref: ArrayLike) -> np.ndarray:
    ref = check_probability_vector("pi_ref", pi_ref)
    if (ref <= 0).any():
        raise ValueError("pi_ref must have positive entries (the KL term's gradient is "
                         f"infinite where pi_ref = 0), got {ref[ref <= 0].flat[0]!r}")
    return ref


def _prepare_step(logits: ArrayLike, pi_ref: ArrayLike, success_mask: ArrayLike,
                  beta: ArrayLike, lr: ArrayLike, gradient: str) -> tuple[np.ndarray, ...]:
    z = _check_logits(logits, finite=True)
    ref = _check_pi_ref(pi_ref)
    mask = check_success_mask(success_mask)
    b = check_beta(beta)[..., None]
    step = check_real("lr", lr, 0.0, open_low=True)[..., None]
    check_choice("gradient", gradient, GRADIENTS)
    return tuple(broadcast(logits=z, pi_ref=ref, success_mask=mask, beta=b, lr=step))


def _payoff(log_pi: np.ndarray, log_ref: np.ndarray, mask: np.ndarray, b: np.ndarray,
            cal: Calibration) -> np.ndarray:
    """``c = A - beta log(pi / pi_ref)`` with ``A = +w+(p)`` / ``-w-(p)`` at the PoS of ``pi``."""
    with np.errstate(divide="ignore"):
        log_s = special.logsumexp(np.where(mask, log_pi, -np.inf), axis=-1)
        log_f = special.logsumexp(np.where(mask, -np.inf, log_pi), axis=-1)
    logit_p = log_s - log_f
    cal.check_boundary(logit_p, "logits")
    w_plus, w_minus = cal.weights_of_logit(logit_p)
    adv = np.where(mask, w_plus[..., None], -w_minus[..., None])
    return adv - b * (log_pi - log_ref)


def _step(z: np.ndarray, log_ref: np.ndarray, mask: np.ndarray, b: np.ndarray,
          lr: np.ndarray, gradient: str, cal: Calibration) -> np.ndarray:
    log_pi, pi = _log_softmax(z)
    g = _centred(pi, _payoff(log_pi, log_ref, mask, b, cal))
    return lr * (g if gradient == "natural" else pi * g)


def grpo_logit_step(
    logits: ArrayLike,
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    lr: ArrayLike,
    *,
    gradient: str = "plain",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """The logit change ``dz`` of one exact-gradient GRPO step of a tabular softmax policy.

    Ascends ``J(z) = E_pi[A] - beta KL(pi || pi_ref)`` at ``pi = softmax(logits)``,
    ``A = +w+(p)`` on a success and ``-w-(p)`` on a failure at the current PoS
    ``p`` (the library's calibration weights, held fixed during the step). With
    ``c = A - beta log(pi / pi_ref)``:

    - ``gradient="plain"``: ``dz = lr grad_z J = lr pi (c - E_pi c)`` (softmax policy
      gradient);
    - ``gradient="natural"``: ``dz = lr (c - E_pi c)``, the natural gradient (the
      softmax Fisher ``diag(pi) - pi pi^T`` maps it to the plain one), Cui et al.'s
      ``dz_a ∝ A(a)`` (arXiv 2505.22617); with ``lr = 1 / beta`` it is the paper's
      GRPO iteration (Mroueh, arXiv 2503.06639, Theorem 1).

    Parameters
    ----------
    logits : array_like
        Finite logits of the current policy, outputs on the last axis.
    pi_ref : array_like
        Reference policy, positive entries summing to 1 over the last axis.
    success_mask : array_like
        1/True on the outputs the verifier accepts.
    beta : array_like
        KL strength, ``> 0``.
    lr : array_like
        Step size, ``> 0``.
    gradient : {"plain", "natural"}
        The step's geometry (above).
    calibration, **calibration_kwargs
        The calibration of the advantage (default: the paper's GRPO, ``eps = 1e-5``).
    """
    z, ref, mask, b, step = _prepare_step(logits, pi_ref, success_mask, beta, lr, gradient)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    return _step(z, np.log(ref), mask, b, step, gradient, cal)[()]


def step_entropy_covariance(
    logits: ArrayLike,
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    lr: ArrayLike,
    *,
    gradient: str = "plain",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Covariance form of the entropy change of one :func:`grpo_logit_step`.

    Cui et al. (arXiv 2505.22617), tabular softmax: ``dH ~ -lr Cov_pi(log pi, pi c)``
    for the plain policy gradient and ``dH ~ -lr Cov_pi(log pi, c)`` for the natural
    one, with ``c = A - beta log(pi / pi_ref) - E_pi[...]`` the step's *centred*
    payoff (their advantage ``Q - V`` is centred; the calibrated GRPO advantage has
    ``E_pi A = p w+ - (1 - p) w- = 0``, the KL term is not centred, and in the plain
    form ``Cov(log pi, pi c)`` changes with the centring). Written from the payoff,
    not from ``dz``; equals :func:`entropy_change_first_order` of the step, the
    derivative ``d/dt H(z + t dz)`` at ``t = 0``. Arguments as :func:`grpo_logit_step`.
    """
    z, ref, mask, b, step = _prepare_step(logits, pi_ref, success_mask, beta, lr, gradient)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    log_pi, pi = _log_softmax(z)
    c = _centred(pi, _payoff(log_pi, np.log(ref), mask, b, cal))
    f = c if gradient == "natural" else pi * c
    h = _entropy(log_pi, pi)[..., None]
    cov = np.sum(pi * (log_pi + h) * _centred(pi, f), axis=-1)
    return (-step[..., 0] * cov)[()]


@dataclass(frozen=True)
class EntropyRun:
    """An exact-gradient GRPO run of the tabular bandit (:func:`exact_gradient_run`).

    Arrays have the steps on the first axis (``n_steps + 1`` entries, the start
    first): ``logits`` ``(n_steps + 1, ..., K)``, ``entropy`` ``H_t`` and
    ``reward`` ``R_t = p_t``, the expected reward (the PoS), ``(n_steps + 1, ...)``.
    """

    logits: np.ndarray
    entropy: np.ndarray
    reward: np.ndarray


def exact_gradient_run(
    pi_ref: ArrayLike,
    success_mask: ArrayLike,
    beta: ArrayLike,
    lr: ArrayLike,
    n_steps: int,
    *,
    gradient: str = "plain",
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> EntropyRun:
    """``n_steps`` exact-gradient GRPO steps (:func:`grpo_logit_step`) from ``z_0 = log pi_ref``.

    No sampling: every step uses the exact expected gradient and the calibration
    weights at the exact PoS. Records the entropy ``H_t`` and the expected reward
    ``R_t = p_t`` along the run: the (H, R) pairs of Cui et al.'s empirical law
    (arXiv 2505.22617). Arguments as :func:`grpo_logit_step`; leading axes of
    ``pi_ref``, ``success_mask``, ``beta`` and ``lr`` broadcast (a batch of runs).
    """
    ref = _check_pi_ref(pi_ref)
    n_steps = check_count("n_steps", n_steps, 0)
    log_ref = np.log(ref)
    z, ref, mask, b, step = _prepare_step(log_ref, ref, success_mask, beta, lr, gradient)
    check_memory("n_steps", n_steps, 8.0 * (n_steps + 1) * max(z.size, 1) * 3)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    log_ref = np.log(ref)
    path = [z]
    for _ in range(n_steps):
        path.append(path[-1] + _step(path[-1], log_ref, mask, b, step, gradient, cal))
    zs = np.stack(path)
    log_pi, pi = _log_softmax(zs)
    with np.errstate(divide="ignore"):
        log_s = special.logsumexp(np.where(mask, log_pi, -np.inf), axis=-1)
        log_f = special.logsumexp(np.where(mask, -np.inf, log_pi), axis=-1)
    return EntropyRun(logits=zs, entropy=_entropy(log_pi, pi), reward=special.expit(log_s - log_f))


# ----------------------------------------------------------- the empirical law
@dataclass(frozen=True)
class EntropyLawFit:
    """Least-squares fits of ``R = -a exp(H) + b`` and ``R = a' H + b'`` (:func:`fit_entropy_laws`).

    ``exp_a``, ``exp_b``: the exponential law's constants; ``lin_a``, ``lin_b``
    (``a'``, ``b'``): the linear law's; ``exp_rms``, ``lin_rms``: the residual mean
    squares ``(1/n) sum (R - fit)^2``. Shapes: the leading axes of the input.
    """

    exp_a: np.ndarray
    exp_b: np.ndarray
    lin_a: np.ndarray
    lin_b: np.ndarray
    exp_rms: np.ndarray
    lin_rms: np.ndarray


def _check_pairs(entropy: ArrayLike, reward: ArrayLike, *, min_points: int = 3,
                 seeds: bool = False) -> tuple[np.ndarray, np.ndarray]:
    h = check_real("entropy", entropy)
    r = check_real("reward", reward)
    h, r = broadcast(entropy=h, reward=r)
    if h.ndim == 0 or h.shape[-1] < min_points:
        raise ValueError(f"entropy and reward must hold at least {min_points} points on their "
                         f"last axis, got shape {h.shape}")
    if seeds and (h.ndim < 2 or h.shape[-2] < 2):
        raise ValueError("entropy and reward must have shape (..., n_seeds, n_points) with "
                         f"n_seeds >= 2, got shape {h.shape}")
    if (np.ptp(h, axis=-1) == 0).any():
        raise ValueError("entropy must vary along the last axis (a constant entropy "
                         "determines neither law)")
    return h, r


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Closed-form least squares ``y = s x + t`` over the last axis (centred sums)."""
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    slope = np.sum(xc * yc, axis=-1) / np.sum(xc * xc, axis=-1)
    icept = y.mean(axis=-1) - slope * x.mean(axis=-1)
    resid = y - (slope[..., None] * x + icept[..., None])
    return slope, icept, np.mean(resid * resid, axis=-1)


def fit_entropy_laws(entropy: ArrayLike, reward: ArrayLike) -> EntropyLawFit:
    """Fit ``R = -a exp(H) + b`` (Cui et al., arXiv 2505.22617) and ``R = a' H + b'``.

    Both laws are linear in their two constants, so each is an ordinary least
    squares fit in closed form (centred sums): the exponential law regresses ``R``
    on ``-exp(H)``, the linear one on ``H``. ``entropy`` and ``reward`` hold the
    pairs on their last axis (at least 3, the entropy not constant); leading axes
    are separate fits. Returns an :class:`EntropyLawFit`.
    """
    h, r = _check_pairs(entropy, reward)
    shift = h.max(axis=-1, keepdims=True)  # regress on -exp(H - max H), rescale a after
    ea, eb, erms = _linear_fit(-np.exp(h - shift), r)
    la, lb, lrms = _linear_fit(h, r)
    return EntropyLawFit(exp_a=(ea * np.exp(-shift[..., 0]))[()], exp_b=eb[()],
                         lin_a=la[()], lin_b=lb[()], exp_rms=erms[()], lin_rms=lrms[()])


@dataclass(frozen=True)
class EntropyLawComparison:
    """The two laws compared over seeds (:func:`compare_entropy_laws`).

    ``fits``: the per-seed :class:`EntropyLawFit`; ``difference``: the mean over
    seeds of ``lin_rms - exp_rms`` (positive: the exponential law fits better);
    ``standard_error``: its standard error ``std(ddof=1) / sqrt(n_seeds)``;
    ``n_se``: ``difference / standard_error`` (signed; ``+-inf`` for a non-zero
    difference with no spread, 0 for none); ``better``: ``"exponential"``,
    ``"linear"`` or ``"neither"`` (``abs(n_se) <= 1``); ``describes``: True where the
    exponential law's residual mean square is below the linear law's by more than
    3 standard errors (the criterion committed for issue 24).
    """

    fits: EntropyLawFit
    difference: np.ndarray
    standard_error: np.ndarray
    n_se: np.ndarray
    better: np.ndarray
    describes: np.ndarray


def compare_entropy_laws(entropy: ArrayLike, reward: ArrayLike) -> EntropyLawComparison:
    """Compare the residual mean squares of the two laws of :func:`fit_entropy_laws` over seeds.

    ``entropy`` and ``reward`` have shape ``(..., n_seeds, n_points)``, one run per
    seed (``n_seeds >= 2``). Per seed ``d = lin_rms - exp_rms``; the result gives
    the mean of ``d``, its standard error over seeds and their ratio. Returns an
    :class:`EntropyLawComparison`.
    """
    h, r = _check_pairs(entropy, reward, seeds=True)
    fits = fit_entropy_laws(h, r)
    d = np.asarray(fits.lin_rms - fits.exp_rms)
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    se = d.std(axis=-1, ddof=1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_se = np.where(se > 0, mean / np.where(se > 0, se, 1.0),
                        np.where(mean == 0, 0.0, np.sign(mean) * np.inf))
    better = np.where(n_se > 1, "exponential", np.where(n_se < -1, "linear", "neither"))
    return EntropyLawComparison(fits=fits, difference=mean[()], standard_error=se[()],
                                n_se=n_se[()], better=better[()], describes=(n_se > 3)[()])
