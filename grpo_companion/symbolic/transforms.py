"""Which objective of the success probability each calibration ascends (beyond the paper).

With 0/1 rewards and no KL term, the expected policy gradient of a calibration
with weights ``w+(p)``, ``w-(p)`` (the advantage of a success is ``+w+``, of a
failure ``-w-``; paper, eqs. 3, 4 and 13) is::

    E[A grad log pi] = w+ E[1{r=1} grad log pi] - w- E[1{r=0} grad log pi]
                     = (w+ + w-) grad p = Omega(p) grad p,

because ``E[1{r=1} grad log pi] = grad p`` and ``E[1{r=0} grad log pi] =
grad(1 - p) = -grad p`` (the weights are evaluated at the sampling policy and
not differentiated). The update therefore ascends ``F(p)`` with ``F' = Omega``
(Proposition 1's ``Omega``), and on the logit ``L`` of the success probability
the flow is ``dL/dt = p (1 - p) Omega(p) = dF/dL``.

Davis and Recht (arXiv 2510.13651) show that GRPO is gradient ascent on
``arcsin(sqrt(p))``. Here the paper's calibration with ``eps = 0`` (eq. 3)
gives ``Omega = 1 / sqrt(p (1 - p))`` and ``F = 2 asin(sqrt(p))``; with
``eps > 0`` (eq. 4) ``F = asin((2p - 1)/sqrt(1 + 4 eps)) + asin(1/sqrt(1 + 4
eps))``, which tends to ``2 asin(sqrt(p))`` as ``eps -> 0``; mean-only (Dr.
GRPO, eq. 13) and RLOO ascend ``p`` itself.

Every formula is taken from the registry of calibrations
(:mod:`grpo_companion.theory.normalizations`) through
:func:`~grpo_companion.symbolic.calibration.calibration_weights`, or, for a
calibration with a finite ``group_size``, through the exact finite-group
expectation :func:`~grpo_companion.symbolic.calibration.group_weights`.
"""

from __future__ import annotations

from functools import cache

import sympy as sp
from sympy.integrals.rationaltools import ratint

from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.variants import CALIBRATIONS

from .calibration import calibration_weights, group_weights
from .symbols import eps, p, sigmoid

__all__ = [
    "ascended_objective",
    "davis_recht_objective",
    "expected_gradient_factor",
    "logit_flow",
    "resolve",
    "two_outcome_gradient",
]

#: the logit of the success probability in the two-outcome model
L = sp.Symbol("L", real=True)
#: the square-root odds ``sqrt(p / (1 - p))``, the variable of the fallback integration
_u = sp.Symbol("u", positive=True)
_upper = sp.Symbol("U", positive=True)
_s = sp.Symbol("s", real=True)
_w_plus, _w_minus = sp.symbols("w_+ w_-", real=True)


def resolve(calibration: Calibration | str) -> Calibration:
    """A :class:`~grpo_companion.theory.Calibration`, or the preset of ``CALIBRATIONS`` named so.

    Raises
    ------
    ValueError
        If ``calibration`` is neither a ``Calibration`` nor one of the names of
        ``grpo_companion.theory.CALIBRATIONS``.
    """
    if isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, str) and calibration in CALIBRATIONS:
        return CALIBRATIONS[calibration]
    raise ValueError(f"calibration must be a Calibration or one of {tuple(CALIBRATIONS)}, "
                     f"got {calibration!r}")


@cache
def two_outcome_gradient() -> tuple[sp.Expr, sp.Expr]:
    """Expected gradient of the whitened objective in a two-outcome model with logit ``L``.

    The policy gives a success with probability ``p = sigmoid(L)`` and a
    failure with ``1 - p``; the advantages are ``+w+`` and ``-w-`` (symbols,
    held fixed: they are computed from the sampling policy, eqs. 1-4). Summing
    over the two outcomes::

        E[A d/dL log pi] = p w+ d/dL log p + (1 - p) (-w-) d/dL log(1 - p).

    Returns
    -------
    (expectation, factor):
        ``E[A d/dL log pi]`` as a function of ``p``, and ``factor =
        expectation / (dp/dL)``, proven equal to ``w+ + w-`` (so ``Omega``).
    """
    prob = sigmoid(L)
    expectation = (prob * _w_plus * sp.diff(sp.log(prob), L)
                   + (1 - prob) * (-_w_minus) * sp.diff(sp.log(1 - prob), L))
    factor = sp.simplify(expectation / sp.diff(prob, L))
    if sp.simplify(factor - (_w_plus + _w_minus)) != 0:  # pragma: no cover - SymPy regression
        raise AssertionError(f"two-outcome gradient factor derived as {factor}")
    # back to p: sigmoid(L) -> p
    in_p = sp.simplify(expectation.subs(sp.exp(-L), (1 - p) / p))
    return sp.factor(in_p), factor


def _weights(cal: Calibration) -> tuple[sp.Expr, sp.Expr]:
    if cal.group_size is None:
        w = calibration_weights(cal)
    else:  # exact finite-group expectation, G in 2..8
        w = group_weights(cal.group_size, cal)
    return w.w_plus, w.w_minus


@cache
def _gradient_factor(cal: Calibration) -> sp.Expr:
    _, factor = two_outcome_gradient()
    w_plus, w_minus = _weights(cal)
    g = factor.subs({_w_plus: w_plus, _w_minus: w_minus})
    if cal.group_size is None:
        return sp.together(g)
    # RLOO's registered gains scale by n / (n - 1) in floating point; keep the rationals exact
    return sp.factor(sp.nsimplify(sp.expand(g), rational=True))


def expected_gradient_factor(calibration: Calibration | str) -> sp.Expr:
    """``g(p)`` with ``E[A grad log pi] = g(p) grad p`` for 0/1 rewards and no KL.

    Derived in :func:`two_outcome_gradient`: ``g = w+ + w- = Omega`` (the
    ``Omega`` of Proposition 1 and Table 1), with the registry's weights
    (eqs. 3, 4 for ``"paper"``/``"trl"``, eq. 13 for ``"mean_only"``). A
    calibration with ``group_size = G`` (2..8) uses the exact expected weights
    of a group of ``G`` (:func:`~grpo_companion.symbolic.calibration.group_weights`):
    the other samples of the group are independent of the first, so
    ``E[A_1 grad log pi(o_1)] = (E[A_1 | r_1 = 1] - E[A_1 | r_1 = 0]) grad p``.
    The presets have ``group_size=None`` (the population), where ``"rloo"`` is
    mean-only; with a finite ``G`` RLOO's baseline is unbiased and ``g = 1``
    still.

    Parameters
    ----------
    calibration : Calibration or str
        A calibration, or a preset name of ``grpo_companion.theory.CALIBRATIONS``.
        The smoothing is the symbol ``eps`` (``varepsilon``) unless the
        calibration has ``eps = 0``.
    """
    return _gradient_factor(resolve(calibration))


def logit_flow(calibration: Calibration | str) -> sp.Expr:
    """``dL/dt = p (1 - p) Omega(p)``: the expected gradient flow of the success logit.

    Gradient ascent on the objective in the logit of a two-outcome policy moves
    ``L`` at rate ``E[A d/dL log pi] = p (1 - p) g(p)``; this equals ``dF/dL``
    for ``F`` of :func:`ascended_objective`, since ``dp/dL = p (1 - p)``.
    """
    return p * (1 - p) * expected_gradient_factor(calibration)


def davis_recht_objective() -> sp.Expr:
    """``2 asin(sqrt(p))``: Davis and Recht's transform (arXiv 2510.13651), times 2.

    It is what the paper's calibration with ``eps = 0`` (eq. 3) ascends.
    """
    return 2 * sp.asin(sp.sqrt(p))


# ------------------------------------------------------------------ integration
def _is_clean(expr: sp.Expr) -> bool:
    return not (expr.has(sp.Integral) or expr.has(sp.I) or expr.has(sp.Min)
                or expr.has(sp.Max) or expr.has(sp.nan) or expr.has(sp.zoo))


def _derivative_matches(anti: sp.Expr, integrand: sp.Expr, var: sp.Symbol,
                        points: tuple[float, ...]) -> bool:
    """``d anti / d var == integrand`` at a few points and smoothings, to 30 digits.

    SymPy 1.14's rational integration returns 0 for ``2 eps / (eps u^2 + u +
    eps)`` (a symbolic-coefficient denominator), so every antiderivative is
    checked before it is used.
    """
    diff = sp.diff(anti, var) - integrand
    for x in points:
        for e in (sp.Rational(1, 1000), sp.Rational(1, 10)):
            value = sp.N(diff.subs({var: x, eps: e}), 30)
            scale = abs(sp.N(integrand.subs({var: x, eps: e}), 30)) + 1
            if not value.is_number or abs(value) > sp.Float(1e-20) * scale:
                return False
    return True


def _antiderivative_u(integrand: sp.Expr) -> sp.Expr | None:
    """An antiderivative in ``u`` of a function of ``u``, term by term, checked."""
    points = (sp.Rational(3, 10), sp.Rational(17, 10), 4)
    terms = sp.Add.make_args(sp.apart(integrand, _u)) if integrand.is_rational_function(_u) \
        else (integrand,)
    total = sp.Integer(0)
    for term in terms:
        candidates = [lambda t=term: sp.integrate(t, _u)]
        if term.is_rational_function(_u):
            candidates.append(lambda t=term: ratint(t, _u, real=False))
        for make in candidates:
            anti = make()
            if not anti.has(sp.Integral) and _derivative_matches(anti, term, _u, points):
                total += anti
                break
        else:
            return None
    return total


def _rewrite_condition(cond: sp.Basic) -> sp.Basic:
    """``U < c`` as ``p < c^2 / (1 + c^2)`` (``p`` increases with ``U = sqrt(p / (1 - p))``)."""
    def one(rel: sp.Basic) -> sp.Basic:
        if isinstance(rel, sp.core.relational.Relational):
            lhs, rhs = rel.lhs, rel.rhs
            if lhs == _upper and rhs.is_number:
                return rel.func(p, rhs**2 / (1 + rhs**2))
            if rhs == _upper and lhs.is_number:
                return rel.func(lhs**2 / (1 + lhs**2), p)
        return rel
    return cond.replace(lambda e: isinstance(e, sp.core.relational.Relational), one)


def _to_p(expr: sp.Expr) -> sp.Expr:
    """Replace ``U`` by ``sqrt(p / (1 - p))``, with ``atan(U) = asin(sqrt(p))``."""
    expr = expr.replace(sp.atan(_upper), sp.asin(sp.sqrt(p)))
    expr = expr.subs(_upper, sp.sqrt(p / (1 - p)))
    return expr if expr.has(sp.Piecewise) else sp.simplify(expr)


def _integrate_in_odds(omega: sp.Expr) -> sp.Expr | None:
    """``int_0^p Omega`` with ``s = u^2 / (1 + u^2)``, ``u`` the positive square-root odds.

    On ``u > 0`` the square root ``sqrt(s (1 - s)) = u / (1 + u^2)`` is known to
    SymPy, ``Max(s, 1 - s)`` becomes a ``Piecewise`` in ``u`` that it
    integrates, and the whitened integrands become rational functions.
    """
    s_of_u = _u**2 / (1 + _u**2)
    integrand = sp.simplify(omega.subs(p, s_of_u) * sp.diff(s_of_u, _u))
    integrand = sp.piecewise_fold(integrand.rewrite(sp.Piecewise))
    pieces = integrand.args if isinstance(integrand, sp.Piecewise) else ((integrand, True),)
    if len(pieces) == 1:
        anti = _antiderivative_u(pieces[0][0])
        if anti is None:
            return None
        value = anti.subs(_u, _upper) - sp.limit(anti, _u, 0, "+")
        return _to_p(value)
    # piecewise: integrate on (0, U) with SymPy's piecewise integration, then map the conditions
    value = sp.integrate(integrand, (_u, 0, _upper))
    if value.has(sp.Integral) or value.has(sp.I):
        return None
    value = sp.piecewise_fold(sp.simplify(value.rewrite(sp.Piecewise)))
    if not isinstance(value, sp.Piecewise):
        return _to_p(value) if _is_clean(value) else None
    out = []
    for expr, cond in value.args:
        expr = sp.logcombine(sp.simplify(expr), force=True)
        out.append((_to_p(expr), _rewrite_condition(cond)))
    result = sp.Piecewise(*out)
    return None if result.has(sp.Min) or result.has(sp.Max) else result


@cache
def _ascended_objective(cal: Calibration) -> sp.Expr:
    omega = expected_gradient_factor(cal)
    direct = sp.integrate(omega.subs(p, _s), (_s, 0, p))
    if _is_clean(direct):
        return direct
    in_odds = _integrate_in_odds(omega)
    if in_odds is not None:
        return in_odds
    return sp.Integral(omega.subs(p, _s), (_s, 0, p))


def ascended_objective(calibration: Calibration | str) -> sp.Expr:
    """``F(p) = int_0^p Omega(s) ds``: the objective of ``p`` that the calibration ascends.

    ``F' = g`` of :func:`expected_gradient_factor` and ``F(0) = 0``. SymPy
    integrates in ``p`` first; where that leaves an integral, complex logarithms
    or ``Min``/``Max``, it integrates in the square-root odds ``u = sqrt(p /
    (1 - p))`` instead (every antiderivative is checked by differentiation);
    where neither gives a closed form the unevaluated ``Integral`` is returned.

    For the presets (on ``0 < p < 1``):

    - ``"paper"`` (eq. 4): ``asin((2p - 1)/sqrt(1 + 4 eps)) + asin(1/sqrt(1 + 4 eps))``,
      written by SymPy with ``sqrt(eps + 1/4)``; with ``eps = 0`` (eq. 3) it is
      ``asin(2p - 1) + pi/2 = 2 asin(sqrt(p))``, Davis and Recht's transform;
    - ``"trl"`` (``sqrt(p (1 - p)) + eps``): ``2 asin(sqrt(p))`` minus a
      logarithmic term of order ``eps log(1/eps)``, from the rational integrand
      ``2u / ((1 + u^2)(eps u^2 + u + eps))`` (SymPy's form, with
      ``sqrt(-1/(2 eps - 1))``, is real for ``eps < 1/2``). By hand, with
      ``D = sqrt(1 - 4 eps^2)`` and ``u = sqrt(p / (1 - p))``, it is
      ``2 asin(sqrt(p)) - (2 eps / D) log[(1 + D)(1 - D + 2 eps u) / ((1 - D)(1 + D + 2 eps u))]``;
    - ``"mean_only"`` (eq. 13) and ``"rloo"``: ``p``;
    - ``"max_abs"``: ``-log(1 - p)`` for ``p <= 1/2``, ``log(4 p)`` above.

    Parameters
    ----------
    calibration : Calibration or str
        A calibration, or a preset name of ``grpo_companion.theory.CALIBRATIONS``.
    """
    return _ascended_objective(resolve(calibration))
