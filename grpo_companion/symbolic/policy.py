"""Closed-form optimal policies of the KL-regularised GRPO step.

On a finite outcome space split into successes and failures, the step
``max_pi E_pi[A] - beta KL(pi || anchor)`` is solved from its first-order
(Lagrange) conditions. The anchor is the reference policy (Theorem 1), the
previous policy (mirror GRPO, Theorem 4) or any policy (Theorem 8); the
success probability of the solution gives the PoS map in logit form
(Theorem 2, Proposition 1, eqs. 8, 11-12, 15).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import sympy as sp

from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.variants import ANCHOR_KINDS, Anchor, mix_targets, share_pairs

from .calibration import as_calibration, calibration_weights
from .contrastive import w_minus_sym, w_plus_sym
from .symbols import alpha, beta, logit, p, p_ref, sigmoid

p_anchor = sp.Symbol("p_anchor", real=True)
lagrange_multiplier = sp.Symbol("lambda", real=True)


@dataclass(frozen=True)
class OptimalPolicy:
    """First-order solution of ``max_pi E_pi[A] - beta KL(pi||anchor)`` (Theorem 8).

    Attributes
    ----------
    anchor:
        Anchor probabilities ``a_i`` (successes first); they sum to 1.
    lagrangian:
        ``sum pi_i A_i - beta sum pi_i log(pi_i/a_i) - lambda (sum pi_i - 1)``.
    policy:
        Optimal ``pi_i = a_i exp(A_i/beta) / Z``.
    partition:
        ``Z = p_anchor exp(w_+/beta) + (1 - p_anchor) exp(-w_-/beta)``.
    success_prob:
        Success probability of the optimal policy as a function of ``p_anchor``.
    logit_step:
        ``Eq(logit p_new, logit p_anchor + (w_+ + w_-)/beta)``.
    hessian_diagonal:
        Second derivatives of the objective, ``-beta/pi_i < 0`` (strict concavity).
    """

    anchor: tuple[sp.Symbol, ...]
    lagrangian: sp.Expr
    policy: tuple[sp.Expr, ...]
    partition: sp.Expr
    success_prob: sp.Expr
    logit_step: sp.Eq
    hessian_diagonal: tuple[sp.Expr, ...]


@cache
def optimal_policy(n_success: int = 2, n_failure: int = 2) -> OptimalPolicy:
    """Solve the KL-regularised step with a generic anchor (Theorems 1, 4, 8).

    The advantage is ``+w_+`` on the ``n_success`` success outcomes and
    ``-w_-`` on the failures. Stationarity in each ``pi_i`` gives
    ``pi_i = a_i exp((A_i - lambda)/beta - 1)``; the normalisation constraint
    fixes ``lambda``, which produces the partition function. Summing the
    policy over successes and taking log-odds gives the logit step.

    Raises
    ------
    ValueError
        If a class is empty or larger than 4 outcomes.
    """
    for name, n in (("n_success", n_success), ("n_failure", n_failure)):
        if not 1 <= n <= 4:
            raise ValueError(f"{name}={n} must be between 1 and 4")
    n = n_success + n_failure
    a = sp.symbols(f"a1:{n + 1}", positive=True)
    pi = sp.symbols(f"pi1:{n + 1}", positive=True)
    adv = [w_plus_sym] * n_success + [-w_minus_sym] * n_failure
    lam = lagrange_multiplier
    objective = sum(q * A for q, A in zip(pi, adv, strict=True)) - beta * sum(
        q * sp.log(q / ai) for q, ai in zip(pi, a, strict=True)
    )
    lagrangian = objective - lam * (sum(pi) - 1)
    stationary = [sp.solve(sp.diff(lagrangian, q), q)[0] for q in pi]
    # write the multiplier through m = exp(-1 - lambda/beta) > 0, so that each
    # stationary point is a_i exp(A_i/beta) m and normalisation gives m = 1/Z
    m = sp.Symbol("m", positive=True)
    stationary = [
        sp.powsimp(sp.expand(sp.expand_log(s.subs(lam, -beta - beta * sp.log(m)), force=True)))
        for s in stationary
    ]
    m_value = sp.solve(sp.Eq(sum(stationary), 1), m)[0]
    policy = tuple(s.subs(m, m_value) for s in stationary)

    # Z is the common normaliser: pi_i = a_i exp(A_i/beta) / Z.
    partition_raw = sp.simplify(1 / m_value)
    success_mass = sum(a[:n_success])
    partition = p_anchor * sp.exp(w_plus_sym / beta) + (1 - p_anchor) * sp.exp(-w_minus_sym / beta)
    on_simplex = {a[-1]: 1 - sum(a[:-1])}
    check = (partition_raw - partition.subs(p_anchor, success_mass)).subs(on_simplex)
    if sp.simplify(check) != 0:  # pragma: no cover
        raise AssertionError(f"partition function mismatch: {check}")

    success_prob_raw = sp.simplify(sum(policy[:n_success]))
    success_prob = p_anchor * sp.exp(w_plus_sym / beta) / partition
    check = (success_prob_raw - success_prob.subs(p_anchor, success_mass)).subs(on_simplex)
    if sp.simplify(check) != 0:  # pragma: no cover
        raise AssertionError(f"success probability mismatch: {check}")

    step = logit(p_anchor) + (w_plus_sym + w_minus_sym) / beta
    # compare odds rather than logits, so no branch of log is involved
    odds = success_prob / (1 - success_prob)
    target = p_anchor / (1 - p_anchor) * sp.exp((w_plus_sym + w_minus_sym) / beta)
    check = sp.simplify(odds - target)
    if check != 0:  # pragma: no cover
        raise AssertionError(f"logit step mismatch: {check}")
    hessian = tuple(sp.diff(objective, q, 2) for q in pi)
    return OptimalPolicy(
        anchor=a,
        lagrangian=lagrangian,
        policy=tuple(
            a_i * sp.exp(A / beta) / sp.Symbol("Z", positive=True)
            for a_i, A in zip(a, adv, strict=True)
        ),
        partition=partition,
        success_prob=success_prob,
        logit_step=sp.Eq(logit(sp.Symbol("p_new", real=True)), step, evaluate=False),
        hessian_diagonal=hessian,
    )


@dataclass(frozen=True)
class PoSMap:
    """Success-probability map of one GRPO variant.

    Attributes
    ----------
    next_prob:
        ``p_n`` as an expression in ``(p, p_ref, beta, eps, alpha)`` with ``p = p_{n-1}``.
    logit_form:
        ``Eq(logit p_n, anchor logit + omega(p)/beta)``.
    partition:
        Partition function of the optimal policy with this anchor and calibration.
    """

    next_prob: sp.Expr
    logit_form: sp.Eq
    partition: sp.Expr


p_next = sp.Symbol("p_n", real=True)


def anchor_kind(anchor: Anchor | str) -> str:
    """``"reference"``, ``"mirror"`` or ``"two_kl"`` for an :class:`~grpo_companion.theory.Anchor`
    or one of those names (the symbolic two-KL map keeps ``alpha`` as a symbol)."""
    if isinstance(anchor, Anchor):
        return anchor.kind
    if anchor not in ANCHOR_KINDS:
        raise ValueError(f"anchor must be an Anchor or one of {ANCHOR_KINDS}, got {anchor!r}")
    return anchor


def pos_map(
    normalization: Calibration | str = "mean_std",
    eps_placement: str = "sqrt",
    anchor: Anchor | str = "reference",
) -> PoSMap:
    """PoS map for a calibration and an anchor (Theorems 2, 4, 9; Section 5; Table 1).

    ``normalization`` is a :class:`~grpo_companion.theory.Calibration` or a
    normalisation name (with ``eps_placement``); ``anchor`` an
    :class:`~grpo_companion.theory.Anchor` or its kind. The calibration
    weights of :func:`.calibration.calibration_weights` are substituted into
    the generic solution of :func:`optimal_policy`:

    - ``anchor="reference"``: anchor PoS ``p_ref`` (Theorem 2, eq. 15);
    - ``anchor="mirror"``: anchor PoS ``p`` itself (Theorem 4, eqs. 11-12);
    - ``anchor="two_kl"``: geometric-mean anchor with logit
      ``alpha logit p_ref + (1 - alpha) logit p`` (Lemma 3 with no Renyi
      correction, which holds along the iteration started at ``pi_ref``; see
      :func:`.two_kl.conditional_invariance`).
    """
    return _pos_map(as_calibration(normalization, eps_placement), anchor_kind(anchor))


def anchor_pairs(anchor: Anchor | str) -> tuple[tuple[sp.Expr, str], ...]:
    """The (weight, target) pairs of an anchor, with SymPy weights.

    The named anchors' ``Anchor.pairs`` with exact
    weights (``1``); a two-KL anchor's pairs are those of the symbol ``alpha``
    (:func:`~grpo_companion.theory.variants.share_pairs`), whatever its share.
    """
    kind = anchor_kind(anchor)
    if kind == "two_kl":
        return tuple(share_pairs(alpha))
    named = Anchor.reference() if kind == "reference" else Anchor.mirror()
    return tuple((sp.nsimplify(w), t) for w, t in named.pairs)


def geometric_mix(pairs: tuple[tuple[sp.Expr, str], ...], terms: Mapping[str, sp.Expr]) -> sp.Expr:
    """``prod terms[target] ** weight`` over the pairs: Lemma 2's unnormalised geometric anchor.

    The same mix as :func:`~grpo_companion.theory.variants.mix_targets` of the
    targets' logarithms, taken out of the logarithm.
    """
    return mix_targets(pairs, terms, times=lambda w, x: x**w, combine=operator.mul)


@cache
def _pos_map(calibration: Calibration, anchor: str) -> PoSMap:
    """``pos_map`` on a checked calibration and anchor kind (cached)."""
    if anchor not in ANCHOR_KINDS:
        raise ValueError(f"anchor={anchor!r} is not one of {ANCHOR_KINDS}")
    pairs = anchor_pairs(anchor)
    w = calibration_weights(calibration)
    sol = optimal_policy(1, 1)
    # the targets' success probabilities: pi_ref's and pi_{n-1}'s
    target_pos = {"reference": p_ref, "prev": p}
    anchor_logit = mix_targets(pairs, {t: logit(x) for t, x in target_pos.items()})
    success = geometric_mix(pairs, target_pos)
    anchor_prob = success / (success + geometric_mix(pairs, {t: 1 - x for t, x in
                                                            target_pos.items()}))
    weights = {w_plus_sym: w.w_plus, w_minus_sym: w.w_minus}
    logit_rhs = anchor_logit + w.omega / beta
    return PoSMap(
        next_prob=sigmoid(logit_rhs),
        logit_form=sp.Eq(logit(p_next), logit_rhs, evaluate=False),
        partition=sol.partition.subs(weights).subs(p_anchor, anchor_prob),
    )


@cache
def theorem2_map() -> sp.Eq:
    """Theorem 2's ``h(p)`` from the optimal policy, shown equal to Prop. 1's sigmoid form.

    ``h(p) = 1 / (1 + (1 - p_ref)/p_ref * exp(-omega(p)/beta))`` is obtained
    by substituting the eq. (4) weights into ``p_ref exp(w_+/beta) / Z``.
    """
    w = calibration_weights("mean_std", "sqrt")
    sol = optimal_policy(1, 1)
    derived = sol.success_prob.subs({w_plus_sym: w.w_plus, w_minus_sym: w.w_minus})
    derived = derived.subs(p_anchor, p_ref)
    paper = 1 / (1 + (1 - p_ref) / p_ref * sp.exp(-w.omega / beta))
    if sp.simplify(derived - paper) != 0:  # pragma: no cover
        raise AssertionError("Theorem 2 form mismatch")
    return sp.Eq(derived, paper, evaluate=False)
