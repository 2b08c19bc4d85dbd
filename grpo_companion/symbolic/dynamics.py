"""Success-probability dynamics: derivatives, stability, amplification (Sections 3-5).

All results are derived from :func:`.policy.pos_map`, i.e. from
``logit p_n = alpha logit p_ref + (1 - alpha) logit p + Omega(p)/beta`` with
``alpha = 1`` for reference-KL GRPO and ``alpha = 0`` for mirror GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sympy as sp

from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.variants import Anchor

from .calibration import calibration_weights
from .policy import pos_map
from .symbols import alpha, beta, eps, logit, on_unit_interval, p, p_ref, sigmoid
from .two_kl import delta_renyi, p_star


def _omega(
    normalization: Calibration | str = "mean_std", eps_placement: str = "sqrt"
) -> sp.Expr:
    return calibration_weights(normalization, eps_placement).omega


@cache
def sigmoid_derivative() -> sp.Eq:
    """``sigma'(z) = sigma(z) (1 - sigma(z))``, used in every chain rule below."""
    z = sp.Symbol("z", real=True)
    derived = sp.diff(sigmoid(z), z)
    if sp.simplify(derived - sigmoid(z) * (1 - sigmoid(z))) != 0:  # pragma: no cover
        raise AssertionError("sigmoid derivative")
    sigma = sp.Function("sigma")
    return sp.Eq(sp.Derivative(sigma(z), z), sigma(z) * (1 - sigma(z)), evaluate=False)


@dataclass(frozen=True)
class MapDerivative:
    """Derivative of the PoS map ``p -> p_n`` (Proposition 1, Lemma 1).

    Attributes
    ----------
    omega_prime:
        ``dOmega/dp`` simplified.
    logit_slope:
        ``d logit p_n / dp``.
    derivative:
        ``dp_n/dp`` as a function of ``p`` (``sympy.diff`` of the map, kept
        unsimplified for lambdify).
    factored:
        The same derivative written as ``p_n (1 - p_n) * logit_slope``; checked
        equal to ``derivative``.
    at_fixed_point:
        ``dp_n/dp`` at a fixed point ``p_n = p = p_star`` (Lemma 1 for ``alpha = 1``).
    logit_map_slope:
        ``d logit p_n / d logit p`` at a fixed point (equals ``at_fixed_point``),
        the slope of the map in log-odds (Table 1's contraction claim).
    """

    omega_prime: sp.Expr
    logit_slope: sp.Expr
    derivative: sp.Expr
    factored: sp.Expr
    at_fixed_point: sp.Expr
    logit_map_slope: sp.Expr


@cache
def map_derivative(
    normalization: Calibration | str = "mean_std",
    eps_placement: str = "sqrt",
    anchor: Anchor | str = "reference",
) -> MapDerivative:
    """Differentiate the PoS map (Proposition 1; Lemma 1; generalised to two-KL).

    For the reference anchor this gives Proposition 1's
    ``h'(p) = -h (1 - h) (1 - 2p) / (2 beta (p(1-p) + eps)^(3/2))`` and, at a
    fixed point where ``h = p*``, Lemma 1's
    ``p*(1-p*)(2p*-1) / (2 beta (p*(1-p*) + eps)^(3/2))``. For the two-KL
    anchor the fixed-point slope gains ``1 - alpha``.
    """
    pmap = pos_map(normalization, eps_placement, anchor)
    omega = _omega(normalization, eps_placement)
    omega_prime = sp.diff(omega, p)
    logit_rhs = pmap.logit_form.rhs
    logit_slope = sp.together(sp.diff(logit_rhs, p))
    derivative = sp.diff(pmap.next_prob, p)
    h = pmap.next_prob
    factored = h * (1 - h) * logit_slope
    interior = (p, p_ref) if anchor != "mirror" else (p,)
    if sp.simplify(on_unit_interval(derivative - factored, *interior)) != 0:  # pragma: no cover
        raise AssertionError("chain rule failed")
    # at a fixed point p_n = p = p*, so dp_n/dp = p*(1-p*) d logit p_n/dp there
    prev_share = {"reference": 0, "mirror": 1, "two_kl": 1 - alpha}[anchor]
    at_fixed = prev_share + p_star * (1 - p_star) * omega_prime.subs(p, p_star) / beta
    derived = p_star * (1 - p_star) * logit_slope.subs(p, p_star)
    if sp.simplify(derived - at_fixed) != 0:  # pragma: no cover
        raise AssertionError("fixed-point slope mismatch")
    return MapDerivative(
        omega_prime=omega_prime,
        logit_slope=logit_slope,
        derivative=derivative,
        factored=factored,
        at_fixed_point=at_fixed,
        logit_map_slope=at_fixed,
    )


@cache
def lemma1_derivative() -> sp.Eq:
    """Lemma 1: ``h'(p*) = p*(1-p*)(2p*-1) / (2 beta (p*(1-p*)+eps)^(3/2))``."""
    derived = map_derivative().at_fixed_point
    s = p_star
    lemma = s * (1 - s) * (2 * s - 1) / (2 * beta * (s * (1 - s) + eps) ** sp.Rational(3, 2))
    if sp.simplify(derived - lemma) != 0:  # pragma: no cover
        raise AssertionError(f"Lemma 1 mismatch: {derived}")
    return sp.Eq(sp.Symbol("h'(p_star)"), lemma, evaluate=False)


@cache
def stability_bound() -> sp.Expr:
    """Lemma 1's ``B(p*) = p*(1-p*)|2p*-1| / (2 (p*(1-p*)+eps)^(3/2))``.

    ``|h'(p*)| < 1`` iff ``beta > B(p*)``: it is ``beta |h'(p*)|``, which does
    not depend on ``beta``.
    """
    bound = sp.simplify(beta * sp.Abs(lemma1_derivative().rhs))
    if bound.has(beta):  # pragma: no cover
        raise AssertionError("B(p*) depends on beta")
    s = p_star
    return s * (1 - s) * sp.Abs(2 * s - 1) / (2 * (s * (1 - s) + eps) ** sp.Rational(3, 2))


@dataclass(frozen=True)
class Amplification:
    """Theorem 3: ``h(p) - p_ref`` in closed form and its sign.

    ``gap`` is ``sigma(logit p_ref + d) - p_ref`` with ``d = Omega(p)/beta``;
    ``factored`` writes it as ``p_ref (1-p_ref)(e^d - 1) / (1 + p_ref (e^d - 1))``;
    ``positive`` is SymPy's verdict with ``p_ref`` in (0, 1) and ``e^d = 1 + u``, ``u > 0``.
    """

    gap: sp.Expr
    factored: sp.Expr
    increment: sp.Expr
    increment_positive: bool
    positive: bool


@cache
def amplification(
    normalization: Calibration | str = "mean_std", eps_placement: str = "sqrt"
) -> Amplification:
    """Theorem 3: ``h(p) > p_ref`` for every ``p``, hence every fixed point exceeds ``p_ref``.

    The logit increment ``d = Omega(p)/beta`` is positive (shown with ``p`` on
    the open unit interval), and ``sigma(L + d) - sigma(L)`` has the sign of
    ``e^d - 1``.
    """
    d = sp.Symbol("d", positive=True)
    gap = sigmoid(logit(p_ref) + d) - p_ref
    factored = p_ref * (1 - p_ref) * (sp.exp(d) - 1) / (1 + p_ref * (sp.exp(d) - 1))
    if sp.simplify(on_unit_interval(gap - factored, p_ref)) != 0:  # pragma: no cover
        raise AssertionError("Theorem 3 factorisation")
    u = sp.Symbol("u", positive=True)
    positive = on_unit_interval(factored, p_ref).subs(sp.exp(d), 1 + u)
    increment = _omega(normalization, eps_placement) / beta
    return Amplification(
        gap=gap,
        factored=factored,
        increment=increment,
        increment_positive=bool(sp.simplify(on_unit_interval(increment, p)).is_positive),
        positive=bool(sp.factor(positive).is_positive),
    )


@cache
def mirror_increment(
    normalization: Calibration | str = "mean_std", eps_placement: str = "sqrt"
) -> sp.Expr:
    """Theorems 4-5: ``logit p_n - logit p_{n-1} = Omega(p_{n-1})/beta`` (mirror GRPO).

    Returns the increment; it is positive for ``p`` in (0, 1), so the mirror
    PoS sequence increases strictly and has no interior fixed point.
    """
    pmap = pos_map(normalization, eps_placement, "mirror")
    increment = pmap.logit_form.rhs - logit(p)
    if not sp.simplify(on_unit_interval(increment, p)).is_positive:  # pragma: no cover
        raise AssertionError("mirror increment not positive")
    return increment


@dataclass(frozen=True)
class DrGRPO:
    """Section 5: Dr. GRPO (mean-only) dynamics.

    ``first_step``: ``p_1 = sigma(logit p_ref + 1/beta)``; ``second_step_gap``:
    ``h(p_1) - p_1`` (0: the fixed point is reached in one step);
    ``mirror_logits``: ``L_n = logit p_ref + n/beta`` solved by ``rsolve``.
    """

    first_step: sp.Expr
    second_step_gap: sp.Expr
    mirror_logits: sp.Expr


@cache
def dr_grpo() -> DrGRPO:
    """Derive Dr. GRPO's one-step fixed point and mirror arithmetic progression (Section 5)."""
    ref_map = pos_map("mean_only", anchor="reference").next_prob
    first = sp.simplify(ref_map.subs(p, p_ref))
    gap = sp.simplify(ref_map.subs(p, first) - first)
    n = sp.Symbol("n", integer=True, nonnegative=True)
    big_l = sp.Function("L")
    increment = mirror_increment("mean_only")
    progression = sp.rsolve(
        big_l(n + 1) - big_l(n) - increment, big_l(n), {big_l(0): logit(p_ref)}
    )
    return DrGRPO(first_step=first, second_step_gap=gap, mirror_logits=progression)


@cache
def beta_eff_equivalence() -> sp.Eq:
    """Section 5: mean-std with ``beta`` equals mean-only with ``beta_eff = beta sqrt(p(1-p)+eps)``.

    Both the reference and the mirror logit increments agree; the returned
    equation is ``Eq(beta_eff, beta sqrt(p(1-p)+eps))`` solved from
    ``Omega_meanstd(p)/beta = Omega_meanonly(p)/beta_eff``.
    """
    beta_eff = sp.Symbol("beta_eff", positive=True)
    eq = sp.Eq(_omega("mean_std", "sqrt") / beta, _omega("mean_only") / beta_eff)
    solution = sp.solve(eq, beta_eff)
    if len(solution) != 1:  # pragma: no cover
        raise AssertionError(f"beta_eff solutions {solution}")
    display = beta * sp.sqrt(p * (1 - p) + eps)
    if sp.simplify(solution[0] - display) != 0:  # pragma: no cover
        raise AssertionError(f"beta_eff = {solution[0]}")
    for anchor in ("reference", "mirror", "two_kl"):
        a = pos_map("mean_std", "sqrt", anchor).logit_form.rhs
        b = pos_map("mean_only", anchor=anchor).logit_form.rhs.subs(beta, solution[0])
        if sp.simplify(a - b) != 0:  # pragma: no cover
            raise AssertionError(f"beta_eff fails for {anchor}")
    return sp.Eq(beta_eff, display, evaluate=False)


@cache
def two_kl_fixed_point(
    normalization: Calibration | str = "mean_std", eps_placement: str = "sqrt"
) -> sp.Eq:
    """Table 1: fixed-point equation of the two-KL recurrence in log-odds.

    Setting ``p_n = p_{n-1} = p*`` in Theorem 9 and solving the linear
    equation for ``L* = logit p*`` gives
    ``L* = logit p_ref + Delta_R*/alpha + Omega(p*)/(alpha beta)``.
    """
    big_l = sp.Symbol("L_star", real=True)
    omega_star = _omega(normalization, eps_placement).subs(p, p_star)
    recurrence = alpha * logit(p_ref) + (1 - alpha) * big_l + delta_renyi + omega_star / beta
    solution = sp.solve(sp.Eq(big_l, recurrence), big_l)
    if len(solution) != 1:  # pragma: no cover
        raise AssertionError(f"fixed point solutions {solution}")
    table = logit(p_ref) + delta_renyi / alpha + omega_star / (alpha * beta)
    if sp.simplify(solution[0] - table) != 0:  # pragma: no cover
        raise AssertionError("Table 1 two-KL fixed point mismatch")
    return sp.Eq(logit(p_star), table, evaluate=False)


@cache
def fixed_point_equation(
    normalization: Calibration | str = "mean_std",
    eps_placement: str = "sqrt",
    anchor: Anchor | str = "reference",
) -> sp.Expr:
    """Residual ``h(p) - p`` whose roots in (0, 1) are the PoS fixed points (Theorem 2).

    For the two-KL anchor the roots coincide with those of the reference map
    at ``alpha beta`` (see :func:`.two_kl.policy_fixed_point`).
    """
    return pos_map(normalization, eps_placement, anchor).next_prob - p
