"""Reward calibration for binary rewards: eqs. (1), (3), (4) and (13).

The advantage of an outcome is its reward standardised by the statistics of
the reward under the old policy. For a verifiable (0/1) reward these
statistics are those of a Bernoulli variable with mean ``p``, so the
advantage takes only two values, ``+w_plus(p)`` on a success and
``-w_minus(p)`` on a failure. This module derives those weights from the
definitions rather than typing them in.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import sympy as sp

from .symbols import eps, on_unit_interval, p

NORMALIZATIONS = ("mean_std", "mean_only")
EPS_PLACEMENTS = ("sqrt", "std", "none")


@dataclass(frozen=True)
class CalibrationWeights:
    """Weights of one reward calibration.

    Attributes
    ----------
    normalization, eps_placement:
        Which calibration these are (see :func:`calibration_weights`).
    mean, variance:
        Reward mean and variance under the old policy.
    advantage:
        ``Piecewise`` advantage as a function of the reward symbol ``r``.
    w_plus, w_minus:
        Advantage of a success, and minus the advantage of a failure.
    omega:
        ``w_plus + w_minus``, the logit increment per unit ``1/beta`` (Prop. 1).
    """

    normalization: str
    eps_placement: str
    mean: sp.Expr
    variance: sp.Expr
    advantage: sp.Expr
    w_plus: sp.Expr
    w_minus: sp.Expr
    omega: sp.Expr


reward = sp.Symbol("r")


@cache
def bernoulli_moments() -> tuple[sp.Expr, sp.Expr]:
    """Mean and variance of a 0/1 reward that equals 1 with probability ``p``.

    Computed from the probability mass function (Section 2.1, after eq. 2):
    ``mu = sum_r r P(r)`` and ``sigma^2 = sum_r (r - mu)^2 P(r)``.

    Returns
    -------
    (mean, variance):
        ``(p, p*(1 - p))``; the variance is checked to equal the expanded sum.
    """
    pmf = {sp.Integer(1): p, sp.Integer(0): 1 - p}
    mean = sp.expand(sum(r * prob for r, prob in pmf.items()))
    variance = sp.expand(sum((r - mean) ** 2 * prob for r, prob in pmf.items()))
    display = p * (1 - p)
    if sp.expand(variance - display) != 0:  # pragma: no cover - a SymPy regression
        raise AssertionError(f"Bernoulli variance derived as {variance}")
    return mean, display


def _scale(variance: sp.Expr, normalization: str, eps_placement: str) -> sp.Expr:
    """What the centred reward is divided by: 1 (mean only), ``sqrt(var + eps)``
    (paper, eq. 4), ``sqrt(var) + eps`` (practice) or ``sqrt(var)`` (eq. 3)."""
    if normalization == "mean_only":
        return sp.Integer(1)
    if eps_placement == "sqrt":
        return sp.sqrt(variance + eps)
    if eps_placement == "std":
        return sp.sqrt(variance) + eps
    return sp.sqrt(variance)


def _check(normalization: str, eps_placement: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"normalization={normalization!r} is not one of {NORMALIZATIONS}"
        )
    if eps_placement not in EPS_PLACEMENTS:
        raise ValueError(f"eps_placement={eps_placement!r} is not one of {EPS_PLACEMENTS}")


@cache
def calibration_weights(
    normalization: str = "mean_std", eps_placement: str = "sqrt"
) -> CalibrationWeights:
    """Derive the success/failure weights of a reward calibration.

    The advantage is computed from its definition with the Bernoulli moments of
    :func:`bernoulli_moments` and then evaluated at ``r = 1`` and ``r = 0``:

    - ``"mean_std"``, ``"sqrt"``: ``(r - mu) / sqrt(sigma^2 + eps)``, eq. (4);
    - ``"mean_std"``, ``"std"``: ``(r - mu) / (sigma + eps)``, common in code;
    - ``"mean_std"``, ``"none"``: ``(r - mu) / sigma``, eq. (3) (no smoothing);
    - ``"mean_only"``: ``r - mu``, Dr. GRPO's eq. (13) (``eps_placement`` ignored).

    Returns
    -------
    CalibrationWeights
        ``w_plus = A(1)``, ``w_minus = -A(0)``, ``omega = w_plus + w_minus``.
    """
    _check(normalization, eps_placement)
    mean, variance = bernoulli_moments()
    if normalization == "mean_only":
        eps_placement = "none"
    scale = _scale(variance, normalization, eps_placement)
    advantage = (reward - mean) / scale
    w_plus = advantage.subs(reward, 1)
    w_minus = -advantage.subs(reward, 0)
    omega = sp.together(w_plus + w_minus)
    return CalibrationWeights(
        normalization=normalization,
        eps_placement=eps_placement,
        mean=mean,
        variance=variance,
        advantage=sp.Piecewise((w_plus, sp.Eq(reward, 1)), (-w_minus, True)),
        w_plus=w_plus,
        w_minus=w_minus,
        omega=omega,
    )


@cache
def unsmoothed_whitening() -> tuple[sp.Eq, sp.Eq]:
    """Eq. (3): the unsmoothed whitened reward as square-root odds.

    For ``0 < p < 1`` the advantage ``(r - p) / sqrt(p(1-p))`` equals
    ``sqrt((1-p)/p)`` on a success and ``-sqrt(p/(1-p))`` on a failure. The
    equality is proven with ``p`` parametrised on the open unit interval.

    Returns
    -------
    (success, failure):
        ``Eq(A(1), sqrt((1-p)/p))`` and ``Eq(A(0), -sqrt(p/(1-p)))``.
    """
    w = calibration_weights("mean_std", "none")
    success = sp.sqrt((1 - p) / p)
    failure = -sp.sqrt(p / (1 - p))
    for derived, closed in ((w.w_plus, success), (-w.w_minus, failure)):
        if sp.simplify(on_unit_interval(derived - closed, p)) != 0:  # pragma: no cover
            raise AssertionError(f"eq. (3) failed: {derived} != {closed}")
    return (
        sp.Eq(w.w_plus, success, evaluate=False),
        sp.Eq(-w.w_minus, failure, evaluate=False),
    )


@cache
def mean_advantage(normalization: str = "mean_std", eps_placement: str = "sqrt") -> sp.Expr:
    """``E_old[A] = p w_plus - (1 - p) w_minus`` simplified (Section 2.2).

    It is identically 0 for every calibration above: successes and failures
    carry the same total weight, ``w_plus p = w_minus (1 - p)``.
    """
    w = calibration_weights(normalization, eps_placement)
    return sp.simplify(p * w.w_plus - (1 - p) * w.w_minus)


def equal_total_weight(normalization: str = "mean_std", eps_placement: str = "sqrt") -> sp.Eq:
    """``Eq(w_plus * p, w_minus * (1 - p))``, checked by :func:`mean_advantage`."""
    if mean_advantage(normalization, eps_placement) != 0:  # pragma: no cover
        raise AssertionError("E_old[A] is not zero")
    w = calibration_weights(normalization, eps_placement)
    return sp.Eq(w.w_plus * p, w.w_minus * (1 - p), evaluate=False)


@dataclass(frozen=True)
class GroupWeights:
    """Expected weights when mean and std are estimated from a group of ``G`` rewards.

    ``w_plus = E[A_1 | r_1 = 1]`` and ``w_minus = -E[A_1 | r_1 = 0]`` for the
    first sample of a group of ``G`` i.i.d. Bernoulli(``p``) rewards;
    ``mean_advantage = E[A_1]`` (0, since a group's advantages sum to 0).
    """

    group_size: int
    w_plus: sp.Expr
    w_minus: sp.Expr
    mean_advantage: sp.Expr


@cache
def group_weights(
    group_size: int,
    normalization: str = "mean_std",
    eps_placement: str = "sqrt",
    ddof: int = 0,
) -> GroupWeights:
    """Finite-group weights by enumerating all ``2^G`` reward vectors (beyond the paper).

    Each group's mean is ``k/G`` and its variance ``sum (r_i - k/G)^2 / (G - ddof)``;
    a group whose rewards are all equal gets advantage 0 (also when ``eps = 0``).
    This enumeration is independent of the Bernstein-polynomial formula used by
    :mod:`grpo_companion.theory.finite_group`, so the two check each other.

    Raises
    ------
    ValueError
        If ``group_size`` is not in 2..8 or ``ddof`` not in {0, 1}.
    """
    _check(normalization, eps_placement)
    if not 2 <= group_size <= 8:
        raise ValueError(f"group_size={group_size} must be between 2 and 8")
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof!r} must be 0 or 1")
    g = group_size
    success_part = sp.Integer(0)
    failure_part = sp.Integer(0)
    for rewards in itertools.product((0, 1), repeat=g):
        k = sum(rewards)
        if k in (0, g):
            continue
        mean = sp.Rational(k, g)
        variance = sum((r - mean) ** 2 for r in rewards) / sp.Integer(g - ddof)
        scale = _scale(variance, normalization, eps_placement)
        prob = p**k * (1 - p) ** (g - k)
        advantage = (rewards[0] - mean) / scale
        if rewards[0]:
            success_part += prob * advantage
        else:
            failure_part += prob * advantage
    w_plus = sp.factor(sp.expand(success_part / p))
    w_minus = sp.factor(sp.expand(-failure_part / (1 - p)))
    mean_adv = sp.simplify(success_part + failure_part)
    return GroupWeights(g, w_plus, w_minus, mean_adv)
