"""Probability-of-success (PoS) recurrences of Table 1, in logit space.

With ``L = logit(p)`` every row of Table 1 (paper) is the map::

    L_n = alpha * L_ref + (1 - alpha) * L_{n-1} + Omega(p_{n-1}) / beta

``alpha = 1``: reference KL (Theorem 2, eq. 8; Proposition 1);
``alpha = 0``: mirror KL (Theorem 4, eqs. 11-12);
``0 < alpha < 1``: two-KL (Theorem 9, eq. 23) for policies that are a
reward-class tilt of ``pi_ref`` (e.g. started at ``pi_0 = pi_ref``), for which
the Renyi correction is zero (see :mod:`grpo_companion.theory.policies`).
The calibration enters only through ``Omega``; ``"mean_only"`` gives the
Dr. GRPO rows (``Omega = 1``).
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
    check_flag,
    check_logit,
    check_memory,
    check_probability,
)

from .calibration import Calibration, resolve_calibration
from .logistic import _log_bernoulli_variance, logit, sigmoid
from .variants import mix_targets, share_pairs

__all__ = [
    "iterate",
    "iterate_logit",
    "pos_map",
    "pos_map_derivative",
    "pos_map_logit",
    "pos_map_logit_derivative",
    "stability_bound",
]


def _check_map_inputs(
    logit_p: np.ndarray, logit_p_ref: np.ndarray, alpha: np.ndarray, cal: Calibration
) -> None:
    """Reject inputs for which the map is undefined (would produce NaN)."""
    uses_ref = alpha > 0
    uses_prev = alpha < 1
    if cal.undefined_at_boundary:
        if np.isinf(logit_p).any():
            raise ValueError(
                "p must be in (0, 1) when eps=0 with population whitening "
                "(Omega is infinite at 0 and 1), got p in {0, 1}"
            )
        if (np.isinf(logit_p_ref) & uses_ref).any():
            raise ValueError(
                "p_ref must be in (0, 1) when eps=0 with population whitening and alpha > 0, "
                "got p_ref in {0, 1}"
            )
    clash = uses_ref & uses_prev & np.isinf(logit_p) & np.isinf(logit_p_ref)
    clash &= np.sign(logit_p) != np.sign(logit_p_ref)
    if clash.any():
        raise ValueError(
            "for 0 < alpha < 1, p and p_ref must not be 0 and 1 (the geometric-mean anchor "
            "pi_ref^alpha pi^(1-alpha) has no mass)"
        )


def _weighted(weight: np.ndarray, logit_l: np.ndarray) -> np.ndarray | float:
    """``weight * L`` with ``0 * inf = 0`` (``0.0`` where every weight is 0)."""
    if not np.any(weight):
        return 0.0
    with np.errstate(invalid="ignore"):
        out = weight * logit_l
    if np.all(weight > 0):
        return out
    return np.where(weight > 0, out, 0.0)


def _affine_parts(
    logit_p_ref: np.ndarray, alpha: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The anchor term split for an iteration: ``alpha * L_ref`` and ``1 - alpha``.

    The targets that stay put along the iteration (every one but ``pi_{n-1}``),
    mixed once by :func:`_anchor_logit`'s rule (``0 * inf = 0``), and the weight
    that :func:`_prev_part` gives ``L_{n-1}`` at each step.
    """
    def times(weight: np.ndarray, logit_l: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # an array even where every weight is 0
            return np.where(weight > 0, weight * logit_l, 0.0)

    pairs = share_pairs(alpha)
    fixed = mix_targets([(w, t) for w, t in pairs if t != "prev"],
                        {"reference": logit_p_ref}, times=times)
    return fixed, _prev_slope(alpha)


def _prev_part(keep: np.ndarray, logit_p: np.ndarray) -> np.ndarray | float:
    """``(1 - alpha) * L_{n-1}`` with ``0 * inf = 0``: the moving target of the anchor term."""
    return _weighted(keep, logit_p)


def _anchor_logit(lr: np.ndarray, lp: np.ndarray, a: np.ndarray) -> np.ndarray | float:
    """The anchor term ``alpha L_ref + (1 - alpha) L_{n-1}`` (Theorem 9 without ``Delta_R``).

    The targets' logits mixed by the anchor's one rule
    (:func:`~grpo_companion.theory.variants.mix_targets`) with the shares of ``alpha``.
    """
    return mix_targets(share_pairs(a), {"reference": lr, "prev": lp}, times=_weighted)


def _prev_slope(a: np.ndarray) -> np.ndarray:
    """``d(anchor term) / dL_{n-1} = 1 - alpha``: the mix of each target's slope."""
    return mix_targets(share_pairs(a), {"reference": 0.0, "prev": 1.0})


def _prepare(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    alpha: ArrayLike,
    calibration: Calibration | None,
    kwargs: dict[str, Any],
    names: tuple[str, str] = ("logit_p", "logit_p_ref"),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Calibration]:
    """Check, broadcast and resolve the map's inputs; ``names`` are the caller's for the logits."""
    lp = check_logit(names[0], logit_p)
    lr = check_logit(names[1], logit_p_ref)
    b = check_beta(beta)
    a = check_alpha(alpha)
    cal = resolve_calibration(calibration, **kwargs)
    lp, lr, b, a = broadcast(**{names[0]: lp, names[1]: lr, "beta": b, "alpha": a})
    _check_map_inputs(lp, lr, a, cal)
    return lp, lr, b, a, cal


def pos_map_logit(
    logit_p: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """One step of the PoS recurrence on logits (Table 1; Theorems 2, 4, 9).

    ``L_n = alpha L_ref + (1 - alpha) L_{n-1} + Omega(sigmoid(L_{n-1})) / beta``.
    Logits may be ``+-inf`` (PoS exactly 1 or 0).

    Parameters
    ----------
    logit_p, logit_p_ref : array_like
        Logits of ``p_{n-1}`` and ``p_ref``.
    beta : array_like
        KL strength, ``> 0``.
    alpha : array_like
        Reference share of the two-KL penalty, in [0, 1].
    calibration : Calibration, optional
        Or pass the :func:`~grpo_companion.theory.weights` keywords.
    """
    lp, lr, b, a, cal = _prepare(logit_p, logit_p_ref, beta, alpha, calibration,
                                 calibration_kwargs)
    return _map_logit(lp, lr, b, a, cal)


def _map_logit(
    lp: np.ndarray, lr: np.ndarray, b: np.ndarray, a: np.ndarray, cal: Calibration
) -> np.ndarray:
    """The logit map on checked, broadcast inputs."""
    with np.errstate(over="ignore"):
        return _anchor_logit(lr, lp, a) + cal.omega_unchecked(lp) / b


def pos_map(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """PoS map ``p_n = h(p_{n-1})`` (Theorem 2 eq. 8, Theorem 4 eq. 12, Theorem 9 eq. 23).

    ``h(p) = sigmoid(alpha logit(p_ref) + (1 - alpha) logit(p) + Omega(p) / beta)``.
    ``p_ref`` in {0, 1} is allowed (absorbing); see :func:`pos_map_logit`.
    """
    lp = logit(check_probability("p", p))
    lr = logit(check_probability("p_ref", p_ref))
    lp, lr, b, a, cal = _prepare(lp, lr, beta, alpha, calibration, calibration_kwargs,
                                 names=("p", "p_ref"))
    return sigmoid(_map_logit(lp, lr, b, a, cal))


def iterate_logit(
    logit_p0: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    *,
    alpha: ArrayLike = 1.0,
    keep_path: bool = True,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Iterate :func:`pos_map_logit` ``n_steps`` times from ``logit_p0``.

    Returns
    -------
    ndarray
        Shape ``(n_steps + 1, *broadcast_shape)`` with the starting logit first,
        or only the final logits when ``keep_path=False``.
    """
    return _iterate(logit_p0, logit_p_ref, beta, n_steps, alpha, keep_path, calibration,
                    calibration_kwargs, to_probability=False,
                    names=("logit_p0", "logit_p_ref"))


def iterate(
    p0: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    *,
    alpha: ArrayLike = 1.0,
    keep_path: bool = True,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """PoS sequence ``p_0, ..., p_n`` of Table 1's recurrences (see :func:`iterate_logit`).

    Returns an array of shape ``(n_steps + 1, ...)`` (or the last step only if
    ``keep_path=False``). Use :func:`iterate_logit` to start or follow
    probabilities closer to 1 than float64 can hold.
    """
    lp = logit(check_probability("p0", p0))
    lr = logit(check_probability("p_ref", p_ref))
    return _iterate(lp, lr, beta, n_steps, alpha, keep_path, calibration, calibration_kwargs,
                    to_probability=True, names=("p0", "p_ref"))


def _iterate(
    logit_p0: ArrayLike,
    logit_p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    alpha: ArrayLike,
    keep_path: bool,
    calibration: Calibration | None,
    calibration_kwargs: dict[str, Any],
    *,
    to_probability: bool,
    names: tuple[str, str],
) -> np.ndarray:
    """The iteration loop shared by :func:`iterate_logit` and :func:`iterate`.

    Each step is computed in place, and a kept path is filled row by row (as
    probabilities when ``to_probability``), so a large grid costs one pass of
    the map per step and one write of the output.
    """
    n_steps = check_count("n_steps", n_steps, 0)
    keep_path = check_flag("keep_path", keep_path)
    lp, lr, b, a, cal = _prepare(logit_p0, logit_p_ref, beta, alpha, calibration,
                                 calibration_kwargs, names=names)
    if keep_path:
        check_memory("n_steps", n_steps, 8.0 * (n_steps + 1) * lp.size, "the kept path")
    ref_part, keep = _affine_parts(lr, a)
    inv_beta = 1.0 / b
    current = np.array(lp, dtype=np.float64)
    path = np.empty((n_steps + 1, *current.shape)) if keep_path else None

    def emit(row: int) -> None:
        if path is None:
            return
        out = path[row, ...]
        if to_probability:
            # sigmoid as 1 / (1 + exp(-L)): exact to rounding for every p >= 2.2e-308
            # (exp(-L) may overflow to inf, giving 0 below that) and about twice as fast
            # as scipy's expit on large grids
            np.negative(current, out=out)
            np.exp(out, out=out)
            out += 1.0
            np.reciprocal(out, out=out)
        else:
            out[...] = current

    emit(0)
    with np.errstate(over="ignore"):
        for n in range(1, n_steps + 1):
            step = cal.omega_unchecked(current)
            step *= inv_beta
            step += ref_part
            if np.any(keep):
                step += _prev_part(keep, current)
            current = step
            emit(n)
    if path is not None:
        return path
    return special.expit(current) if to_probability else current


def pos_map_logit_derivative(
    logit_p: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """``dL_n / dL_{n-1} = (1 - alpha) + Omega'(L) / beta`` (logit form of Proposition 1).

    At a fixed point this equals ``dp_n / dp_{n-1}``, the multiplier used by Lemma 1.
    """
    lp = check_logit("logit_p", logit_p)
    b = check_beta(beta)
    a = check_alpha(alpha)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lp, b, a = broadcast(logit_p=lp, beta=b, alpha=a)
    cal.check_boundary(lp)
    return _map_logit_slope(lp, b, a, cal)


def _map_logit_slope(lp: np.ndarray, b: np.ndarray, a: np.ndarray,
                     cal: Calibration) -> np.ndarray:
    return (_prev_slope(a) + cal.omega_prime_unchecked(lp) / b)[()]


def pos_map_derivative(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Derivative ``h'(p) = dp_n / dp_{n-1}`` of the PoS map (Proposition 1, Lemma 1).

    ``h'(p) = h (1 - h) [(1 - alpha) / (p (1 - p)) + Omega'(p) / beta]``; for the
    paper's GRPO with ``alpha = 1`` this is
    ``-h (1 - h) (1 - 2p) / (2 beta (p (1 - p) + eps)^(3/2))``.
    Requires ``p`` in (0, 1).
    """
    lp = logit(check_probability("p", p, open_interval=True))
    lr = logit(check_probability("p_ref", p_ref))
    lp, lr, b, a, cal = _prepare(lp, lr, beta, alpha, calibration, calibration_kwargs,
                                 names=("p", "p_ref"))
    nxt = _map_logit(lp, lr, b, a, cal)
    omega_prime = cal.omega_prime_unchecked(lp)
    with np.errstate(over="ignore"):
        slope = _prev_slope(a) + omega_prime / b
    # h (1 - h) / (p (1 - p)), formed in log space
    log_ratio = _log_bernoulli_variance(nxt) - _log_bernoulli_variance(lp)
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = np.exp(log_ratio)
        near = ratio * slope
    redo = ~np.isfinite(near)
    if np.any(redo):
        # The ratio overflows (p within ~1e-300 of 0 or 1), or Omega' / beta does (beta
        # tiny; then h is 1 or 0 to far below float64 and the ratio is 0, and 0 * inf is
        # NaN): multiply in log space. Where Omega' / beta overflows, 1 - alpha <= 1 is
        # below its last digit, so log |slope| = log |Omega'| - log beta.
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            over = np.isinf(slope) & np.isfinite(omega_prime)
            log_slope = np.where(over, np.log(np.abs(omega_prime)) - np.log(b),
                                 np.log(np.abs(slope)))
            far = np.sign(slope) * np.exp(log_ratio + log_slope)
        near = np.where(redo, np.where(slope == 0, 0.0, far), near)
    if np.isnan(near).any():  # not expected: the map itself is undefined there
        at = np.flatnonzero(np.isnan(np.broadcast_to(near, lp.shape)))[0]
        raise ValueError(
            "h'(p) is undefined for these arguments: the map's logit "
            f"{float(nxt.flat[at])!r} or its slope {float(slope.flat[at])!r} is not a number "
            f"(p={float(special.expit(lp.flat[at]))!r}, beta={float(b.flat[at])!r}, "
            f"alpha={float(a.flat[at])!r}); a larger beta or eps keeps Omega / beta finite")
    return near[()]


def stability_bound(
    p_star: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Lemma 1: the reference map converges locally to ``p*`` if ``beta > B(p*)``.

    ``B(p*) = |dOmega/dL|`` at ``p*``; for the paper's calibration
    ``B(p*) = p* (1 - p*) |2 p* - 1| / (2 (p* (1 - p*) + eps)^(3/2))``.
    At a fixed point of the reference map ``h'(p*) = Omega'(L*) / beta``, so
    ``|h'(p*)| < 1`` exactly when ``beta > B(p*)``.
    """
    lp = logit(check_probability("p_star", p_star))
    cal = resolve_calibration(calibration, **calibration_kwargs)
    cal.check_boundary(lp, "p_star")
    return np.abs(cal.omega_prime_unchecked(lp))
