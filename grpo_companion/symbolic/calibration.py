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
from types import SimpleNamespace
from typing import Any

import sympy as sp

from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.normalizations import sympy_ops

from .symbols import eps, on_unit_interval, p


@dataclass(frozen=True)
class CalibrationWeights:
    """Weights of one reward calibration.

    Attributes
    ----------
    normalization, eps_placement:
        Which calibration these are (see :func:`calibration_weights`);
        ``eps_placement`` is ``"none"`` when the calibration has ``eps = 0``.
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


def as_calibration(calibration: Calibration | str = "mean_std",
                   eps_placement: str = "sqrt") -> Calibration:
    """A :class:`~grpo_companion.theory.Calibration`, or one built from a normalisation name.

    The symbolic layer takes the same objects as the numeric one. Its
    expressions keep the smoothing as the symbol ``eps`` unless the
    calibration's ``eps`` is 0 (the unsmoothed eq. 3).
    """
    if isinstance(calibration, Calibration):
        return calibration
    if not isinstance(calibration, str):
        raise ValueError(f"calibration must be a Calibration or a normalisation name, "
                         f"got {calibration!r}")
    return Calibration(normalization=calibration, eps_placement=eps_placement)


def symbolic_gains(calibration: Calibration, succ: Any, fail: Any,
                   n: int | None) -> tuple[sp.Expr, sp.Expr]:
    """The calibration's one definition evaluated on SymPy arguments.

    ``succ`` and ``fail`` are the shares of successes and failures (``p`` and
    ``1 - p`` for the population, ``k/n`` and ``(n-k)/n`` for a group of
    ``n``); the smoothing is the symbol ``eps`` unless the calibration has
    ``eps = 0``.
    """
    spec = SimpleNamespace(eps=eps if calibration.eps != 0 else sp.Integer(0),
                           eps_placement=calibration.eps_placement, ddof=calibration.ddof,
                           group_size=None, normalization=calibration.normalization)
    plus, minus = calibration.definition.gains(succ, fail, n, spec, sympy_ops())
    return sp.sympify(plus), sp.sympify(minus)


def _key(calibration: Calibration) -> tuple[Any, ...]:
    """What the symbolic expressions depend on (not the numeric value of ``eps``)."""
    d = calibration.definition
    return (d.name, id(d.gains), calibration.eps_placement if d.uses_eps else "",
            calibration.eps == 0 if d.uses_eps else False, calibration.ddof)


def calibration_weights(
    calibration: Calibration | str = "mean_std", eps_placement: str = "sqrt"
) -> CalibrationWeights:
    """Derive the success/failure weights of a reward calibration from its definition.

    The calibration's registered ``gains`` function is evaluated on the
    symbols ``p`` and ``1 - p`` (the population), with the Bernoulli moments
    of :func:`bernoulli_moments`. For the built-ins this gives:

    - ``"mean_std"``, ``"sqrt"``: ``(r - mu) / sqrt(sigma^2 + eps)``, eq. (4);
    - ``"mean_std"``, ``"std"``: ``(r - mu) / (sigma + eps)``, common in code;
    - ``"mean_std"`` with ``eps = 0``: ``(r - mu) / sigma``, eq. (3);
    - ``"mean_only"``: ``r - mu``, Dr. GRPO's eq. (13).

    Parameters
    ----------
    calibration : Calibration or str
        The calibration, or a registered normalisation name.
    eps_placement : {"sqrt", "std"}
        Used only when ``calibration`` is a name.

    Returns
    -------
    CalibrationWeights
        ``w_plus = A(1)``, ``w_minus = -A(0)``, ``omega = w_plus + w_minus``.
    """
    cal = as_calibration(calibration, eps_placement)
    return _calibration_weights(_key(cal), cal)


@cache
def _calibration_weights(key: tuple[Any, ...], cal: Calibration) -> CalibrationWeights:
    mean, variance = bernoulli_moments()
    w_plus, w_minus = symbolic_gains(cal, p, 1 - p, None)
    uses_eps = cal.definition.uses_eps
    placement = (cal.eps_placement if cal.eps != 0 else "none") if uses_eps else "none"
    return CalibrationWeights(
        normalization=cal.normalization,
        eps_placement=placement,
        mean=mean,
        variance=variance,
        advantage=sp.Piecewise((w_plus, sp.Eq(reward, 1)), (-w_minus, True)),
        w_plus=w_plus,
        w_minus=w_minus,
        omega=sp.together(w_plus + w_minus),
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
    w = calibration_weights(Calibration(eps=0.0))
    success = sp.sqrt((1 - p) / p)
    failure = -sp.sqrt(p / (1 - p))
    for derived, closed in ((w.w_plus, success), (-w.w_minus, failure)):
        if sp.simplify(on_unit_interval(derived - closed, p)) != 0:  # pragma: no cover
            raise AssertionError(f"eq. (3) failed: {derived} != {closed}")
    return (
        sp.Eq(w.w_plus, success, evaluate=False),
        sp.Eq(-w.w_minus, failure, evaluate=False),
    )


def mean_advantage(calibration: Calibration | str = "mean_std",
                   eps_placement: str = "sqrt") -> sp.Expr:
    """``E_old[A] = p w_plus - (1 - p) w_minus`` simplified (Section 2.2).

    It is identically 0 for every built-in calibration: successes and failures
    carry the same total weight, ``w_plus p = w_minus (1 - p)``.
    """
    w = calibration_weights(calibration, eps_placement)
    return sp.simplify(p * w.w_plus - (1 - p) * w.w_minus)


def equal_total_weight(calibration: Calibration | str = "mean_std",
                       eps_placement: str = "sqrt") -> sp.Eq:
    """``Eq(w_plus * p, w_minus * (1 - p))``, checked by :func:`mean_advantage`."""
    if mean_advantage(calibration, eps_placement) != 0:  # pragma: no cover
        raise AssertionError("E_old[A] is not zero")
    w = calibration_weights(calibration, eps_placement)
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


def group_weights(
    group_size: int,
    calibration: Calibration | str = "mean_std",
    eps_placement: str = "sqrt",
    ddof: int = 0,
) -> GroupWeights:
    """Finite-group weights by enumerating all ``2^G`` reward vectors (beyond the paper).

    Each reward vector with ``k`` successes gets the calibration's definition
    at ``(k, G)``; a group whose rewards are all equal gets advantage 0 (also
    when ``eps = 0``). Summing the first sample's advantage over the ``2^G``
    vectors, with their probabilities, is independent of the Bernstein sum used
    by :mod:`grpo_companion.theory.finite_group`, so the two check each other.

    Parameters
    ----------
    group_size : int
        ``G``, from 2 to 8.
    calibration : Calibration or str
        The calibration, or a normalisation name (then ``eps_placement`` and
        ``ddof`` build it).

    Raises
    ------
    ValueError
        If ``group_size`` is not in 2..8 or ``ddof`` not in {0, 1}.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or not 2 <= group_size <= 8:
        raise ValueError(f"group_size={group_size!r} must be an int between 2 and 8")
    if ddof not in (0, 1) or isinstance(ddof, bool):
        raise ValueError(f"ddof={ddof!r} must be 0 or 1")
    if isinstance(calibration, str):
        calibration = Calibration(normalization=calibration, eps_placement=eps_placement,
                                  ddof=ddof)
    cal = as_calibration(calibration)
    return _group_weights(group_size, _key(cal), cal)


@cache
def _group_weights(group_size: int, key: tuple[Any, ...], cal: Calibration) -> GroupWeights:
    g = group_size
    success_part = sp.Integer(0)
    failure_part = sp.Integer(0)
    for rewards in itertools.product((0, 1), repeat=g):
        k = sum(rewards)
        if k in (0, g):
            continue
        plus, minus = symbolic_gains(cal, sp.Rational(k, g), sp.Rational(g - k, g), g)
        prob = p**k * (1 - p) ** (g - k)
        if rewards[0]:
            success_part += prob * plus
        else:
            failure_part -= prob * minus
    w_plus = sp.factor(sp.expand(success_part / p))
    w_minus = sp.factor(sp.expand(-failure_part / (1 - p)))
    mean_adv = sp.simplify(success_part + failure_part)
    return GroupWeights(g, w_plus, w_minus, mean_adv)
