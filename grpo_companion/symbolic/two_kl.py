"""GRPO with two KL penalties (Appendix E: Lemmas 2-3, Theorem 9, Table 1).

The penalty ``beta (alpha KL(pi||pi_ref) + (1 - alpha) KL(pi||pi_prev))`` is
one KL to the normalised geometric mean ``pi_ref^alpha pi_prev^(1-alpha)``
plus a constant (Lemma 2). The success probability of that geometric mean has
a logit that interpolates the two logits plus a Renyi correction comparing
the two policies inside the success class and inside the failure class
(Lemma 3). Everything is derived on a small finite outcome space with
symbolic probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sympy as sp

from grpo_companion.theory.variants import mix_targets

from .calibration import calibration_weights
from .contrastive import w_minus_sym, w_plus_sym
from .policy import anchor_pairs, geometric_mix
from .symbols import alpha, beta, logit, p, p_ref

delta_renyi = sp.Symbol("Delta_R", real=True)
p_star = sp.Symbol("p_star", real=True)
#: The two-KL anchor's (weight, target) pairs, ``alpha`` a symbol: every mix below reads them.
TWO_KL = anchor_pairs("two_kl")


def _two(reference: sp.Expr, prev: sp.Expr) -> dict[str, sp.Expr]:
    return {"reference": reference, "prev": prev}


def renyi_divergence(
    left: tuple[sp.Expr, ...], right: tuple[sp.Expr, ...], order: sp.Expr = alpha
) -> sp.Expr:
    """Renyi divergence ``D_a(P||Q) = log(sum P^a Q^(1-a)) / (a - 1)`` of finite distributions."""
    total = sum(l_i**order * r_i ** (1 - order) for l_i, r_i in zip(left, right, strict=True))
    return sp.log(total) / (order - 1)


def _kl(left: tuple[sp.Expr, ...], right: tuple[sp.Expr, ...]) -> sp.Expr:
    return sum(l_i * sp.log(l_i / r_i) for l_i, r_i in zip(left, right, strict=True))


def _is_zero(expr: sp.Expr) -> bool:
    """Zero test for sums of logs of sums of powers of positive symbols.

    Powers of products are split, common factors are pulled out of each sum
    inside a log, and logs of products are expanded; what is left must cancel.
    """
    expr = sp.expand_power_base(expr, force=True)
    expr = expr.replace(
        lambda e: isinstance(e, sp.log), lambda e: sp.log(sp.factor_terms(e.args[0]))
    )
    expr = sp.expand(sp.expand_log(sp.powsimp(expr, force=True), force=True))
    return sp.simplify(expr) == 0


@dataclass(frozen=True)
class GeometricMeanIdentity:
    """Lemma 2 on an ``n``-outcome space.

    ``lhs = alpha KL(pi||pi_ref) + (1-alpha) KL(pi||pi_o)``,
    ``rhs = KL(pi||pibar) + constant`` with ``pibar = pi_ref^alpha pi_o^(1-alpha) / Z``
    and ``constant = -log Z = (1 - alpha) D_alpha(pi_ref||pi_o)``.
    """

    policy: tuple[sp.Expr, ...]
    reference: tuple[sp.Symbol, ...]
    other: tuple[sp.Symbol, ...]
    lhs: sp.Expr
    rhs: sp.Expr
    constant: sp.Expr
    constant_as_renyi: sp.Expr


@cache
def geometric_mean_identity(n_outcomes: int = 3) -> GeometricMeanIdentity:
    """Prove Lemma 2 with symbolic probabilities on ``n_outcomes`` outcomes.

    ``pi`` is put on the simplex by writing its last entry as one minus the
    others (the identity needs ``sum pi = 1``; the anchors need not be
    normalised for it, only positive).

    Raises
    ------
    ValueError
        If ``n_outcomes`` is not between 2 and 5.
    """
    if not 2 <= n_outcomes <= 5:
        raise ValueError(f"n_outcomes={n_outcomes} must be between 2 and 5")
    free = sp.symbols(f"pi1:{n_outcomes}", positive=True)
    policy = (*free, 1 - sum(free))
    ref = sp.symbols(f"r1:{n_outcomes + 1}", positive=True)
    other = sp.symbols(f"o1:{n_outcomes + 1}", positive=True)
    unnormalised = [geometric_mix(TWO_KL, _two(r, o)) for r, o in zip(ref, other, strict=True)]
    z = sum(unnormalised)
    pibar = tuple(g / z for g in unnormalised)
    lhs = mix_targets(TWO_KL, _two(_kl(policy, ref), _kl(policy, other)))
    constant = -sp.log(z)
    rhs = _kl(policy, pibar) + constant
    if not _is_zero(lhs - rhs):  # pragma: no cover
        raise AssertionError("Lemma 2 failed")
    as_renyi = (1 - alpha) * renyi_divergence(ref, other)
    if sp.simplify(constant - as_renyi) != 0:  # pragma: no cover
        raise AssertionError("Lemma 2 constant is not (1 - alpha) D_alpha")
    return GeometricMeanIdentity(policy, ref, other, lhs, rhs, constant, as_renyi)


@dataclass(frozen=True)
class GeometricMeanPoS:
    """Lemma 3: log-odds of success under the geometric-mean anchor.

    Attributes
    ----------
    reference, prev:
        Probabilities of ``pi_ref`` and ``pi_{n-1}`` (successes first).
    renyi_success, renyi_failure:
        ``D_alpha`` between the two policies' success-conditional and
        failure-conditional distributions.
    correction:
        ``Delta_R = (1 - alpha) (D_F - D_S)``, the Renyi correction of eq. (23).
    anchor_logit:
        ``alpha logit p_ref + (1 - alpha) logit p + Delta_R`` (proven equal to
        the log-odds of the normalised geometric mean).
    """

    reference: tuple[sp.Symbol, ...]
    prev: tuple[sp.Symbol, ...]
    renyi_success: sp.Expr
    renyi_failure: sp.Expr
    correction: sp.Expr
    anchor_logit: sp.Expr


def _class_split(n_success: int, n_failure: int, name: str):
    probs = sp.symbols(f"{name}1:{n_success + n_failure + 1}", positive=True)
    return probs, probs[:n_success], probs[n_success:]


@cache
def geometric_mean_pos(n_success: int = 2, n_failure: int = 2) -> GeometricMeanPoS:
    """Derive Lemma 3 on a finite space with ``n_success`` and ``n_failure`` outcomes.

    The two policies are given by positive symbols (normalisation plays no
    role: the success probabilities are the class masses divided by the
    total). The success/failure conditionals are the policies restricted to
    a class and renormalised.
    """
    for label, n in (("n_success", n_success), ("n_failure", n_failure)):
        if not 1 <= n <= 3:
            raise ValueError(f"{label}={n} must be between 1 and 3")
    ref, ref_s, ref_f = _class_split(n_success, n_failure, "r")
    prev, prev_s, prev_f = _class_split(n_success, n_failure, "q")
    ref_p = sum(ref_s) / sum(ref)
    prev_p = sum(prev_s) / sum(prev)

    def conditional(block):
        return tuple(x / sum(block) for x in block)

    d_s = renyi_divergence(conditional(ref_s), conditional(prev_s))
    d_f = renyi_divergence(conditional(ref_f), conditional(prev_f))
    correction = (1 - alpha) * (d_f - d_s)
    geo = [geometric_mix(TWO_KL, _two(r, q)) for r, q in zip(ref, prev, strict=True)]
    direct = sp.log(sum(geo[:n_success])) - sp.log(sum(geo[n_success:]))
    claimed = mix_targets(TWO_KL, _two(logit(ref_p), logit(prev_p))) + correction
    if not _is_zero(direct - claimed):  # pragma: no cover
        raise AssertionError("Lemma 3 failed")
    return GeometricMeanPoS(ref, prev, d_s, d_f, correction, claimed)


@cache
def lemma3_paper_sign_check() -> sp.Expr:
    """Difference between Lemma 3's printed correction and Theorem 9's.

    Lemma 3 prints ``(alpha - 1)(D_S - D_F)`` and Theorem 9 prints
    ``(1 - alpha)(D_F - D_S)``; both equal :attr:`GeometricMeanPoS.correction`.
    Returns the simplified difference (0).
    """
    d_s, d_f = sp.symbols("D_S D_F", real=True)
    return sp.simplify((alpha - 1) * (d_s - d_f) - (1 - alpha) * (d_f - d_s))


@dataclass(frozen=True)
class TwoKLStep:
    """Theorem 9 derived from the two-KL Lagrangian directly.

    Attributes
    ----------
    policy:
        Optimal ``pi_n`` on the finite space (normalised).
    logit_step:
        ``logit p_n`` as derived, proven equal to
        ``alpha logit p_ref + (1 - alpha) logit p + Delta_R + (w_+ + w_-)/beta``.
    recurrence:
        ``Eq(logit p_n, alpha logit p_ref + (1 - alpha) logit p + Delta_R + Omega(p)/beta)``
        with the eq. (4) weights.
    """

    policy: tuple[sp.Expr, ...]
    logit_step: sp.Expr
    recurrence: sp.Eq


@cache
def two_kl_step(n_success: int = 2, n_failure: int = 2) -> TwoKLStep:
    """Solve ``max E_pi[A] - beta(alpha KL(pi||pi_ref) + (1-alpha) KL(pi||pi_prev))`` (Thm 9).

    Stationarity of the Lagrangian gives
    ``log pi_i = alpha log r_i + (1 - alpha) log q_i + A_i/beta + const``
    without using Lemma 2, so this is an independent check of Lemma 2 +
    Theorem 8 + Lemma 3 combined.
    """
    lemma3 = geometric_mean_pos(n_success, n_failure)
    ref, prev = lemma3.reference, lemma3.prev
    n = len(ref)
    pi = sp.symbols(f"pi1:{n + 1}", positive=True)
    adv = [w_plus_sym] * n_success + [-w_minus_sym] * n_failure
    lam = sp.Symbol("lambda", real=True)
    ref_n = tuple(r / sum(ref) for r in ref)
    prev_n = tuple(q / sum(prev) for q in prev)
    lagrangian = (
        sum(x * a for x, a in zip(pi, adv, strict=True))
        - beta * mix_targets(TWO_KL, _two(_kl(pi, ref_n), _kl(pi, prev_n)))
        - lam * (sum(pi) - 1)
    )
    stationary = [sp.solve(sp.diff(lagrangian, x), x)[0] for x in pi]
    unnormalised = [sp.powsimp(sp.expand_power_base(s, force=True), force=True) for s in stationary]
    # each stationary point is a common factor times r_i^alpha q_i^(1-alpha) exp(A_i/beta)
    z = sp.Symbol("Z", positive=True)
    display = [
        geometric_mix(TWO_KL, _two(r, q)) * sp.exp(a / beta)
        for r, q, a in zip(ref, prev, adv, strict=True)
    ]
    factors = {
        sp.simplify(sp.powsimp(sp.expand_power_base(u / d, force=True), force=True))
        for u, d in zip(unnormalised, display, strict=True)
    }
    if len(factors) != 1:  # pragma: no cover
        raise AssertionError(f"two-KL policy is not a tilted geometric mean: {factors}")
    policy = tuple(d / z for d in display)
    step = sp.log(sum(unnormalised[:n_success])) - sp.log(sum(unnormalised[n_success:]))
    claimed = lemma3.anchor_logit + (w_plus_sym + w_minus_sym) / beta
    if not _is_zero(step - claimed):  # pragma: no cover
        raise AssertionError("Theorem 9 failed")
    omega = calibration_weights("mean_std", "sqrt").omega
    recurrence = sp.Eq(
        logit(sp.Symbol("p_n", real=True)),
        mix_targets(TWO_KL, _two(logit(p_ref), logit(p))) + delta_renyi + omega / beta,
        evaluate=False,
    )
    return TwoKLStep(policy, step, recurrence)


@dataclass(frozen=True)
class ConditionalInvariance:
    """Why the Renyi correction vanishes along the iteration started at ``pi_ref``.

    If ``pi_prev = c_S pi_ref`` on successes and ``c_F pi_ref`` on failures
    (true for ``pi_0 = pi_ref``), both class-conditional Renyi divergences are
    0 and the two-KL step keeps ``pi_n / pi_ref`` constant on each class, so by
    induction ``Delta_R = 0`` at every step.

    Attributes
    ----------
    renyi_success, renyi_failure:
        Simplified ``D_alpha`` between the conditionals (both 0).
    class_ratios:
        ``pi_n(o_i) / pi_ref(o_i)`` for each outcome, simplified.
    """

    renyi_success: sp.Expr
    renyi_failure: sp.Expr
    class_ratios: tuple[sp.Expr, ...]


@cache
def conditional_invariance(n_success: int = 2, n_failure: int = 2) -> ConditionalInvariance:
    """Show the Renyi correction of Theorem 9 is identically 0 when ``pi_0 = pi_ref``."""
    lemma3 = geometric_mean_pos(n_success, n_failure)
    step = two_kl_step(n_success, n_failure)
    c_s, c_f = sp.symbols("c_S c_F", positive=True)
    ref, prev = lemma3.reference, lemma3.prev
    proportional = {
        q: (c_s if i < n_success else c_f) * r
        for i, (r, q) in enumerate(zip(ref, prev, strict=True))
    }

    def clean(e: sp.Expr) -> sp.Expr:
        e = sp.powsimp(sp.expand_power_base(e.subs(proportional), force=True), force=True)
        return sp.simplify(e)

    ratios = tuple(clean(x / r) for x, r in zip(step.policy, ref, strict=True))
    return ConditionalInvariance(
        clean(lemma3.renyi_success), clean(lemma3.renyi_failure), ratios
    )


@cache
def policy_fixed_point() -> sp.Eq:
    """Fixed point of the two-KL policy iteration: ``pi* ∝ pi_ref exp(A/(alpha beta))``.

    Solving ``pi = pi_ref^alpha pi^(1 - alpha) exp(A/beta) / Z`` for ``pi``
    (one outcome, positive symbols) shows the limit policy is the reference-KL
    optimum with ``beta`` replaced by ``alpha beta``; its class conditionals
    equal ``pi_ref``'s, so ``Delta_R* = 0``.
    """
    x, r, z = sp.symbols("pi r Z", positive=True)
    a = sp.Symbol("A", real=True)
    sol = sp.solve(sp.Eq(x, geometric_mix(TWO_KL, _two(r, x)) * sp.exp(a / beta) / z), x)
    if len(sol) != 1:  # pragma: no cover
        raise AssertionError(f"unexpected fixed-point solutions {sol}")
    value = sp.powsimp(sp.expand_power_base(sol[0], force=True), force=True)
    expected = r * sp.exp(a / (alpha * beta)) * z ** (-1 / alpha)
    if sp.simplify(value / expected) != 1:  # pragma: no cover
        raise AssertionError(f"fixed point {value}")
    return sp.Eq(x, expected, evaluate=False)


mixup = sp.Symbol("a", nonnegative=True)  # TRL's ref_model_mixup_alpha, the policy's share
p_new_ref = sp.Symbol("p_ref'", real=True)


@dataclass(frozen=True)
class MovingReference:
    """The recurrence of GRPO with a moving reference (TRL's ``sync_ref_model``; App. C.2).

    Attributes
    ----------
    step:
        ``Eq(logit p_n, alpha logit p_ref + (1 - alpha) logit p + Omega(p)/beta)``, Theorem 2's
        map (Table 1, :func:`.policy.pos_map` with the two-KL anchor) with the current
        reference ``p_ref`` and ``p = p_{n-1}``.
    sync:
        ``Eq(logit p_ref', a logit p_n + (1 - a) logit p_ref)``: the success logit of the
        reference after TRL's parameter mix ``theta_ref <- a theta + (1 - a) theta_ref`` on
        tabular logits, i.e. of the normalised ``pi_n^a pi_ref^(1 - a)``, derived from the
        class-proportional policies of the iteration.
    general_sync:
        The same logit for any two policies ``pi1, ...`` (the policy) and ``r1, ...`` (the
        reference), successes first: Lemma 3 with order ``a``,
        ``a logit p_n + (1 - a) logit p_ref + (1 - a)(D_F - D_S)``, where ``D_S``, ``D_F`` are
        the order-``a`` Renyi divergences between the two policies' success and failure
        conditionals (0 for class-proportional policies, which gives ``sync``).
    mixed_probs:
        The normalised mixed reference on the finite space (class-proportional policy
        ``pi_n = c_S r`` on successes, ``c_F r`` on failures, reference ``r``).
    """

    step: sp.Eq
    sync: sp.Eq
    general_sync: sp.Expr
    mixed_probs: tuple[sp.Expr, ...]


@cache
def moving_reference(n_success: int = 2, n_failure: int = 2,
                     normalization: str = "mean_std") -> MovingReference:
    """Derive the two-dimensional map of ``(L_n, L_ref)`` under a moving reference.

    On a space of ``n_success`` successes and ``n_failure`` failures (each 1 to 3) the
    reference is ``r`` (positive symbols) and the policy ``pi_n`` is class-proportional to
    it, as every policy of the iteration started at ``pi_ref`` is
    (:func:`conditional_invariance`). The reference after one sync is the softmax of
    ``a log pi_n + (1 - a) log r``; its log-odds of success is shown to be
    ``a logit p_n + (1 - a) logit p_ref`` exactly, and Lemma 3
    (:func:`geometric_mean_pos`) gives the general form with the Renyi correction. ``a = 1``
    is staged GRPO's reset ``L_ref' = L_n`` and ``a = 0`` keeps ``L_ref`` (the plain
    recurrence). The numeric counterpart is
    :func:`grpo_companion.theory.analyses.staged.moving_reference_iterate`.
    """
    for label, n in (("n_success", n_success), ("n_failure", n_failure)):
        if not 1 <= n <= 3:
            raise ValueError(f"{label}={n} must be between 1 and 3")
    from .policy import pos_map  # the Table 1 map with the two-KL anchor

    ref, ref_s, ref_f = _class_split(n_success, n_failure, "r")
    c_s, c_f = sp.symbols("c_S c_F", positive=True)
    policy = tuple((c_s if i < n_success else c_f) * r for i, r in enumerate(ref))
    mixed = [x**mixup * r ** (1 - mixup) for x, r in zip(policy, ref, strict=True)]
    mixed_probs = tuple(m / sum(mixed) for m in mixed)
    direct = sp.log(sum(mixed[:n_success])) - sp.log(sum(mixed[n_success:]))
    p_n = sum(policy[:n_success]) / sum(policy)
    p_r = sum(ref_s) / sum(ref)
    claimed = mixup * logit(p_n) + (1 - mixup) * logit(p_r)
    if not _is_zero(direct - claimed):  # pragma: no cover
        raise AssertionError("the mixed reference's success logit is not a L_n + (1 - a) L_ref")
    lemma3 = geometric_mean_pos(n_success, n_failure)  # order alpha: the first policy's share
    rename = {**dict(zip(lemma3.reference, sp.symbols(f"pi1:{len(ref) + 1}", positive=True),
                         strict=True)),
              **dict(zip(lemma3.prev, ref, strict=True)), alpha: mixup}
    general = lemma3.anchor_logit.subs(rename, simultaneous=True)
    step = pos_map(normalization, "sqrt", "two_kl").logit_form
    p_next = sp.Symbol("p_n", real=True)
    sync = sp.Eq(logit(p_new_ref), mixup * logit(p_next) + (1 - mixup) * logit(p_ref),
                 evaluate=False)
    return MovingReference(step, sync, general, mixed_probs)
