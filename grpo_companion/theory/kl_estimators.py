"""Which fixed point sampled GRPO reaches with each per-sample KL estimator.

Sampled GRPO does not add ``KL(pi || pi_ref)`` to its loss but a per-sample
estimate ``k(o)`` averaged over outputs ``o`` drawn from ``pi_old``. Each estimator
is defined once, in the registry :data:`KL_ESTIMATORS` (its formula in ``d = log
pi_ref(o) - log pi(o)`` for numpy and torch alike, its score, the divergence it
follows, a one-line summary); the loss
(:func:`grpo_companion.rl.losses.kl_penalty`) and this module read it, and
:func:`register_kl_estimator` adds one to both. What a gradient step follows is the
*expected gradient* ``grad_theta E_{o ~ pi_old}[k(o)]``; on policy
(``pi_old = pi``, the first of the mu steps) it is, for a softmax policy with
logits ``theta``:

- ``k2``, ``k3_ratio`` (and the exact KL): the gradient of ``KL(pi || pi_ref)``;
- ``k3``: ``pi - pi_ref``, the gradient of the *reverse* ``KL(pi_ref || pi)``;
- ``k1``: zero (its expected score vanishes).

A training run that settles (``pi_n = pi_{n-1}`` on average) settles where the
expected gradient of the whole loss is zero, so each estimator has its own
limit:

- forward KL: the Gibbs tilt ``pi_ref exp(A / beta) / Z``, whose PoS solves the
  paper's fixed-point equation ``logit p = logit p_ref + Omega(p) / beta``
  (:func:`grpo_companion.theory.fixed_points`);
- reverse KL: the maximiser of ``E_pi[A] - beta KL(pi_ref || pi)``,
  ``pi = beta pi_ref / (lam - A)`` (:func:`reverse_kl_policy`), whose PoS solves
  ``p (1 - p) Omega(p) = beta (p - p_ref)`` (:func:`reverse_kl_fixed_points`);
- k1: no anchor at all, the PoS keeps growing towards 1.

For the two-outcome bandit (one success, one failure; the policy *is* its
PoS) :func:`logit_drift` is the expected gradient of the sampled objective
with respect to the success logit ``L``; its zeros are these limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from grpo_companion.validation import (
    broadcast,
    broadcast_shapes,
    check_beta,
    check_choice,
    check_flag,
    check_probability,
    check_probability_vector,
    check_real,
)

from .calibration import Calibration, resolve_calibration
from .logistic import _log_bernoulli_variance, logit, sigmoid

__all__ = [
    "ESTIMATOR_TARGETS",
    "KL_ESTIMATORS",
    "KLEstimator",
    "expected_kl_gradient",
    "kl_estimator_help",
    "kl_estimator_names",
    "register_kl_estimator",
    "unregister_kl_estimator",
    "logit_drift",
    "reverse_kl_fixed_points",
    "reverse_kl_policy",
    "reverse_kl_pos",
]

@dataclass(frozen=True)
class KLEstimator:
    """One per-sample KL estimator: the single definition that the loss and the theory read.

    With ``d = log anchor(o) - log pi(o)`` on an output ``o`` drawn from ``pi_old``:

    Attributes
    ----------
    formula
        The per-sample value, as text.
    value
        ``value(d, xp)``: the per-sample value without the importance ratio, with ``xp``
        the array module (``numpy`` or ``torch``);
        :func:`grpo_companion.rl.losses.kl_penalty` computes the loss's penalty with it.
    score
        ``score(d, xp)``: the factor ``s(o)`` of the expected gradient with respect to the
        logits of a softmax policy, ``sum_o w(o) s(o) (1[o = j] - pi_j)``, where ``w`` is
        ``pi_old`` (or ``pi`` for a ratio-weighted estimator, whose importance ratio turns the
        expectation under ``pi_old`` into one under ``pi``). It is ``-value'(d)``, or
        ``value(d) - value'(d)`` when ratio-weighted, written without cancellation;
        :func:`expected_kl_gradient` reads it, and
        ``tests/theory/test_theory_kl_estimators.py`` checks it against autograd of
        ``value`` through the loss.
    follows
        Which divergence's gradient its expected on-policy gradient is: ``"forward"``
        (``KL(pi || pi_ref)``, the paper's Theorem 2), ``"reverse"`` (``KL(pi_ref || pi)``) or
        ``"none"`` (a zero expected gradient: no anchor).
    ratio_weighted
        Multiplied by the differentiated importance ratio ``pi / pi_old``.
    trl
        The TRL 1.16 setting that computes it, or ``""``.
    summary
        One line for help texts and tables
        (:func:`~grpo_companion.theory.kl_estimators.kl_estimator_help`).
    unbiased
        On policy (``pi_old = pi``) its mean ``E_{o ~ pi}[k(o)]`` is ``KL(pi || anchor)``
        exactly; otherwise it equals the KL only to second order in ``d``.
    stable
        ``stable(logp, anchor_logp, prev_logp, xp)``: the ratio-weighted value formed
        without overflow, the same number as ``exp(logp - prev_logp) value(d)``; ``None``:
        that product. :meth:`~grpo_companion.theory.kl_estimators.KLEstimator.per_token`
        uses it.
    """

    formula: str
    value: Callable[[Any, ModuleType], Any]
    score: Callable[[Any, ModuleType], Any]
    follows: str
    ratio_weighted: bool = False
    trl: str = ""
    summary: str = ""
    unbiased: bool = True
    stable: Callable[[Any, Any, Any, ModuleType], Any] | None = None

    def per_token(self, logp: Any, anchor_logp: Any, prev_logp: Any, xp: ModuleType) -> Any:
        """The per-sample value from the log-probabilities, for ``xp`` numpy or torch.

        ``value(anchor_logp - logp)``, times ``exp(logp - prev_logp)`` when
        ratio-weighted (by ``stable`` where given); ``prev_logp`` is only read then.
        :func:`grpo_companion.rl.losses.kl_penalty` is this with ``xp = torch``.
        """
        if not self.ratio_weighted:
            return self.value(anchor_logp - logp, xp)
        if self.stable is not None:
            return self.stable(logp, anchor_logp, prev_logp, xp)
        return xp.exp(logp - prev_logp) * self.value(anchor_logp - logp, xp)


def _k3_ratio_stable(logp: Any, anchor_logp: Any, prev_logp: Any, xp: ModuleType) -> Any:
    """``(pi / pi_old) k3`` without ``inf * 0``.

    ``exp(logp - prev) (e^d - d - 1)``: where the policy has fallen far below the anchor
    (``d`` large) ``e^d`` overflows while the ratio underflows (``inf * 0 = NaN`` in float32
    from ``d ~ 88``), so there it is formed as ``exp(anchor - prev) - ratio (d + 1)``, the same
    number without the overflow; near ``d = 0`` that form would cancel, and the product is
    kept. Each branch sees only its own range of ``d``, so no inf reaches a gradient.
    """
    diff = anchor_logp - logp
    ratio = xp.exp(logp - prev_logp)
    near = xp.clip(diff, max=1.0)
    far = xp.clip(diff, min=1.0)
    small = ratio * (xp.expm1(near) - near)
    large = xp.exp(anchor_logp - prev_logp) - ratio * (far + 1.0)
    return xp.where(diff <= 1.0, small, large)


#: The per-sample KL estimators, by the name that ``TrainConfig.kl`` and the theory use: the
#: one registry that the loss (:func:`grpo_companion.rl.losses.kl_penalty`), the trainer's
#: choices and help text, and the theory read. Add one with :func:`register_kl_estimator`.
KL_ESTIMATORS: dict[str, KLEstimator] = {
    "k1": KLEstimator("-d", lambda d, xp: -d, lambda d, xp: xp.ones_like(d), "none",
                      summary="-d, unbiased on policy but with a zero expected gradient"),
    "k2": KLEstimator("d**2 / 2", lambda d, xp: 0.5 * (d * d), lambda d, xp: -d, "forward",
                      summary="d**2 / 2, the KL to second order, follows grad KL(pi || anchor)",
                      unbiased=False),
    "k3": KLEstimator("exp(d) - d - 1", lambda d, xp: xp.expm1(d) - d,
                      lambda d, xp: -xp.expm1(d), "reverse",
                      trl="beta > 0, use_bias_correction_kl=False",
                      summary="exp(d) - d - 1 (DeepSeekMath), unbiased but follows "
                              "grad KL(anchor || pi)"),
    "k3_ratio": KLEstimator("(pi / pi_old) (exp(d) - d - 1)", lambda d, xp: xp.expm1(d) - d,
                            lambda d, xp: -d, "forward", ratio_weighted=True,
                            trl="beta > 0, use_bias_correction_kl=True (TRL 1.16's default)",
                            summary="(pi / pi_old) k3 (TRL's default), follows "
                                    "grad KL(pi || anchor)",
                            stable=_k3_ratio_stable),
}
_BUILT_IN_ESTIMATORS = tuple(KL_ESTIMATORS)
_FOLLOWS = ("forward", "reverse", "none")

#: Which divergence each estimator's expected on-policy gradient follows; ``"exact"`` is the
#: exact KL of two tabular policies (the bandit trainer's ``kl="exact"``).
ESTIMATOR_TARGETS: dict[str, str] = {
    "exact": "forward", **{name: e.follows for name, e in KL_ESTIMATORS.items()}}


class _Names(Sequence[str]):
    """The registry's names as a read-only tuple that follows later registrations."""

    def __init__(self, *head: str) -> None:
        self._head = head

    def _now(self) -> tuple[str, ...]:
        return (*self._head, *KL_ESTIMATORS)

    def __getitem__(self, i: Any) -> Any:
        return self._now()[i]

    def __len__(self) -> int:
        return len(self._now())

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __contains__(self, name: object) -> bool:
        return name in self._now()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(other) == self._now()

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return repr(self._now())


def kl_estimator_names(*, exact: bool = False) -> Sequence[str]:
    """The registered estimators' names, as a tuple-like view that follows registrations.

    With ``exact=True`` led by ``"exact"`` (the exact tabular KL): the values of
    ``TrainConfig.kl``. ``grpo_companion.rl.losses.KL_ESTIMATORS`` and ``KL_CHOICES``
    are these two views.
    """
    return _Names("exact") if check_flag("exact", exact) else _Names()


def kl_estimator_help() -> str:
    """Help text for a ``kl`` option, one clause per registered estimator.

    ``"KL penalty in the loss: k1: -d, unbiased on policy but with a zero expected
    gradient; ...; or exact (bandit only: the exact KL of the tabular policies), with
    d = log anchor(o) - log pi(o)"``; each clause is an estimator's ``summary`` (or its
    ``formula``).
    """
    parts = "; ".join(f"{name}: {e.summary or e.formula}" for name, e in KL_ESTIMATORS.items())
    return (f"KL penalty in the loss: {parts}; or exact (bandit only: the exact KL of the "
            "tabular policies), with d = log anchor(o) - log pi(o)")


def _check_estimator_entry(name: str, entry: KLEstimator) -> None:
    """Refuse an estimator whose functions fail on numpy, or whose score or claims are wrong."""
    d = np.linspace(-2.0, 2.0, 41)
    try:
        with np.errstate(all="ignore"):  # a value that is not finite is refused below
            value = np.asarray(entry.value(d, np), dtype=np.float64) * np.ones_like(d)
            score = np.asarray(entry.score(d, np), dtype=np.float64) * np.ones_like(d)
    except Exception as err:  # noqa: BLE001 - report any failure as a bad registration
        raise ValueError(f"KL estimator {name!r}: value(d, xp) and score(d, xp) must run on "
                         f"numpy arrays with xp=numpy ({type(err).__name__}: {err}); use "
                         "xp.exp, xp.expm1, ... and plain arithmetic") from err
    if not (np.all(np.isfinite(value)) and np.all(np.isfinite(score))):
        raise ValueError(f"KL estimator {name!r}: value and score must be finite for d in "
                         "[-2, 2]")
    h = 1e-5
    slope = (np.asarray(entry.value(d + h, np)) - np.asarray(entry.value(d - h, np))) / (2 * h)
    want = value - slope if entry.ratio_weighted else -slope
    if not np.allclose(score, want, rtol=1e-6, atol=1e-6):
        raise ValueError(f"score of KL estimator {name!r} must be "
                         + ("value(d) - value'(d)" if entry.ratio_weighted else "-value'(d)")
                         + f" (the factor of its expected gradient); it is off by up to "
                         f"{float(np.max(np.abs(score - want))):.3g}")
    if entry.stable is not None:
        logp = np.log(np.array([0.1, 0.2, 0.3, 0.4]))  # d below and above 1:
        anchor, prev = logp + np.array([-1.0, 0.5, 3.0, 30.0]), np.log(np.full(4, 0.25))
        plain = np.exp(logp - prev) * entry.value(anchor - logp, np)
        if not np.allclose(entry.stable(logp, anchor, prev, np), plain, rtol=1e-12, atol=0.0):
            raise ValueError(f"stable of KL estimator {name!r} must equal "
                             "exp(logp - prev_logp) value(d)")
    # on policy the ratio is 1: E_pi[value(d)] against KL(pi || anchor) on a small table
    pi, ref = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    d_tab = np.log(ref) - np.log(pi)
    mean = float(np.sum(pi * np.asarray(entry.value(d_tab, np))))
    kl = float(np.sum(pi * -d_tab))
    if entry.unbiased and not math.isclose(mean, kl, rel_tol=1e-9, abs_tol=1e-12):
        raise ValueError(f"KL estimator {name!r} is registered as unbiased, but its mean "
                         f"under pi is {mean!r}, not KL(pi || anchor) = {kl!r}; pass "
                         "unbiased=False")


def register_kl_estimator(
    name: str,
    value: Callable[[Any, ModuleType], Any],
    score: Callable[[Any, ModuleType], Any],
    *,
    follows: str,
    formula: str,
    summary: str,
    ratio_weighted: bool = False,
    unbiased: bool = True,
    trl: str = "",
    stable: Callable[[Any, Any, Any, ModuleType], Any] | None = None,
    replace: bool = False,
) -> KLEstimator:
    """Register a per-sample KL estimator: the one edit that adds it to the loss and the theory.

    Parameters
    ----------
    name : str
        The value of ``TrainConfig.kl`` and of the theory's ``estimator`` that selects it.
    value, score : callable
        ``value(d, xp)`` and ``score(d, xp)`` of :class:`KLEstimator`, with ``xp`` numpy
        or torch (use ``xp.exp``, ``xp.expm1``, ... and plain arithmetic).
    follows : str
        ``"forward"``, ``"reverse"`` or ``"none"``: the divergence whose gradient its
        expected on-policy gradient is (:data:`ESTIMATOR_TARGETS`).
    formula, summary : str
        The per-sample value as text, and one line for help texts.
    ratio_weighted, unbiased, trl, stable
        As in :class:`KLEstimator`.
    replace : bool
        Allow replacing an earlier registration (never a built-in).

    Returns
    -------
    KLEstimator
        The registered entry; :data:`KL_ESTIMATORS` and :data:`ESTIMATOR_TARGETS` hold it.

    Raises
    ------
    ValueError
        If the name is taken or not an identifier, ``follows`` is not one of its three
        values, ``value`` or ``score`` fail on numpy arrays or are not finite on
        ``d`` in [-2, 2], ``score`` is not the derivative it must be (checked by central
        differences), ``stable`` differs from the plain product, or an estimator
        registered as unbiased has another mean than the KL on a three-outcome policy.
    """
    if not isinstance(name, str) or not name.isidentifier() or name == "exact":
        raise ValueError(f"name must be a Python identifier other than 'exact', got {name!r}")
    if name in _BUILT_IN_ESTIMATORS or (name in KL_ESTIMATORS and not replace):
        raise ValueError(f"a KL estimator named {name!r} is already registered; pick another "
                         "name" + ("" if name in _BUILT_IN_ESTIMATORS
                                   else " or pass replace=True"))
    check_choice("follows", follows, _FOLLOWS)
    for label, func in (("value", value), ("score", score)):
        if not callable(func):
            raise ValueError(f"{label} must be callable, got {func!r}")
    if stable is not None and not (callable(stable) and ratio_weighted):
        raise ValueError(f"stable must be None or, for a ratio-weighted estimator, callable; "
                         f"got {stable!r}")
    entry = KLEstimator(str(formula), value, score, follows, bool(ratio_weighted), str(trl),
                        str(summary), bool(unbiased), stable)
    _check_estimator_entry(name, entry)
    KL_ESTIMATORS[name] = entry
    ESTIMATOR_TARGETS[name] = follows
    return entry


def unregister_kl_estimator(name: str) -> None:
    """Remove an estimator added by :func:`register_kl_estimator` (not a built-in)."""
    if name in _BUILT_IN_ESTIMATORS:
        raise ValueError(f"name {name!r} is built in and cannot be removed")
    if name not in KL_ESTIMATORS:
        raise ValueError(f"name {name!r} is not a registered KL estimator")
    del KL_ESTIMATORS[name]
    ESTIMATOR_TARGETS.pop(name, None)

#: The estimator of ``"exact"``'s gradient: that of ``KL(pi || pi_ref)``, as ``k3_ratio``'s.
_EXACT = KLEstimator("KL(pi || pi_ref)", lambda d, xp: xp.expm1(d) - d, lambda d, xp: -d,
                     "forward", ratio_weighted=True)


def _check_estimator(estimator: str) -> str:
    return str(check_choice("estimator", estimator, ("exact", *KL_ESTIMATORS)))


def expected_kl_gradient(
    policy: ArrayLike,
    ref_policy: ArrayLike,
    estimator: str,
    *,
    prev_policy: ArrayLike | None = None,
) -> np.ndarray:
    """Expected gradient ``grad_theta E_{o ~ pi_old}[k(o)]`` for a softmax policy.

    Parameters
    ----------
    policy, ref_policy, prev_policy : array_like
        Probability vectors over outcomes (last axis): the policy ``pi`` being
        differentiated (logits ``theta``), the KL anchor, and the sampling
        policy (default: ``pi`` itself, the on-policy first step). ``policy``
        and ``ref_policy`` must be positive.
    estimator : ``"exact"`` (the exact KL) or a name of :data:`KL_ESTIMATORS`

    Returns
    -------
    ndarray
        The gradient with respect to the logits, same shape as ``policy``
        (it sums to zero over the last axis). Uses
        ``d log pi(o) / d theta_j = 1[o = j] - pi_j``.
    """
    _check_estimator(estimator)
    pi = check_probability_vector("policy", policy)
    ref = check_probability_vector("ref_policy", ref_policy)
    prev = pi if prev_policy is None else check_probability_vector("prev_policy", prev_policy)
    for name, x in (("policy", pi), ("ref_policy", ref)):
        if np.any(x <= 0):
            raise ValueError(f"{name} must be positive (the estimators take logs), "
                             f"got {float(x[x <= 0].flat[0])!r}")
    pi, ref, prev = broadcast(policy=pi, ref_policy=ref, prev_policy=prev)
    est = _EXACT if estimator == "exact" else KL_ESTIMATORS[estimator]
    d = np.log(ref) - np.log(pi)
    weighted = (pi if est.ratio_weighted else prev) * est.score(d, np)
    return weighted - pi * np.sum(weighted, axis=-1, keepdims=True)


def _normaliser_gaps(ref: np.ndarray, adv: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``(lam - A_o) / beta`` for the ``lam > max_{ref_o > 0} A_o`` with
    ``sum_o ref_o beta / (lam - A_o) = 1`` (:func:`reverse_kl_policy`'s normalisation).

    Solved for ``t = (lam - top) / beta``, ``top`` the largest advantage on the support:
    ``sum_o ref_o / (t + (top - A_o) / beta) = 1``, decreasing in ``t``, with a root in
    ``[m / 2, 2]`` (``m``: the reference mass at ``top``), by SciPy's vectorised
    bracketing root finder (``scipy.optimize.elementwise.find_root``) to four epsilons of
    ``t``. Returning the gaps, not ``lam``, keeps their digits where ``beta`` is tiny next
    to ``top`` (``lam`` rounds to ``top`` there; the 200-step bisection on ``lam`` that this
    replaces gave ``pi = nan``). ``tests/theory/test_root_finders.py`` checks ``pi``
    against mpmath.
    """
    from scipy.optimize.elementwise import find_root

    support = ref > 0
    top = np.max(np.where(support, adv, -np.inf), axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        offset = np.where(support, (top - adv) / beta, np.inf)  # +inf: no term
    mass_top = np.sum(np.where(offset == 0, ref, 0.0), axis=-1)
    flat_ref = ref.reshape(-1, ref.shape[-1])
    flat_offset = offset.reshape(flat_ref.shape)

    def excess(t: np.ndarray, i: np.ndarray) -> np.ndarray:
        return np.sum(flat_ref[i] / (t[:, None] + flat_offset[i]), axis=-1) - 1.0

    # at t = m / 2 the top terms alone sum to 2; at t = 2 every term is below ref_o / 2
    res = find_root(excess, (0.5 * mass_top.ravel(), np.full(mass_top.size, 2.0)),
                    args=(np.arange(mass_top.size),),
                    tolerances={"xatol": 0.0, "xrtol": 4.0 * np.finfo(np.float64).eps})
    t = np.asarray(res.x).reshape(mass_top.shape)
    return t[..., None] + offset


def reverse_kl_policy(
    ref_policy: ArrayLike, advantage: ArrayLike, beta: ArrayLike
) -> np.ndarray:
    """Maximiser of ``E_pi[A] - beta KL(pi_ref || pi)`` over the simplex.

    The stationarity condition ``A_o + beta pi_ref(o) / pi(o) = lam`` gives
    ``pi(o) = beta pi_ref(o) / (lam - A(o))`` with ``lam > max A`` (on the
    support of ``pi_ref``) fixed by normalisation (solved to machine
    precision by a bracketing root finder). Unlike the forward-KL optimum (the Gibbs tilt
    ``pi_ref exp(A / beta) / Z``, :func:`grpo_companion.theory.optimal_policy`)
    the tilt is a rational, not exponential, function of the advantage.

    Parameters
    ----------
    ref_policy : array_like
        Reference probability vectors (last axis over outcomes).
    advantage : array_like
        Advantage of each outcome, broadcast against ``ref_policy``.
    beta : array_like
        Penalty strength ``> 0``, one per leading index (broadcast).
    """
    ref = check_probability_vector("ref_policy", ref_policy)
    adv = check_real("advantage", advantage)
    b = check_beta(beta)
    ref, adv = broadcast(ref_policy=ref, advantage=adv)
    broadcast_shapes(**{"ref_policy (batch axes)": ref.shape[:-1], "beta": b.shape})
    return _reverse_kl_policy(ref, adv, b)


def _reverse_kl_policy(ref: np.ndarray, adv: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`reverse_kl_policy` on checked, broadcast inputs."""
    shape = np.broadcast_shapes(ref.shape[:-1], b.shape)
    ref = np.broadcast_to(ref, (*shape, ref.shape[-1]))
    adv = np.broadcast_to(adv, ref.shape)
    b = np.broadcast_to(np.asarray(b, dtype=np.float64), shape)[..., None]
    gaps = _normaliser_gaps(ref, adv, b)  # (lam - A) / beta
    pi = np.where(ref > 0, ref / gaps, 0.0)
    return pi / pi.sum(axis=-1, keepdims=True)


def reverse_kl_pos(
    p_ref: ArrayLike, w_plus: ArrayLike, w_minus: ArrayLike, beta: ArrayLike
) -> np.ndarray:
    """PoS of :func:`reverse_kl_policy` for the calibrated advantage ``+w+`` / ``-w-``.

    Only the class masses matter: ``p = beta p_ref / (lam - w+)`` and
    ``1 - p = beta (1 - p_ref) / (lam + w-)``, with ``lam`` fixed by their sum.
    """
    pr = check_probability("p_ref", p_ref)
    wp = check_real("w_plus", w_plus)
    wm = check_real("w_minus", w_minus)
    b = check_beta(beta)
    pr, wp, wm, b = broadcast(p_ref=pr, w_plus=wp, w_minus=wm, beta=b)
    ref = np.stack([pr, 1.0 - pr], axis=-1)
    adv = np.stack([wp, -wm], axis=-1)
    return _reverse_kl_policy(ref, adv, b)[..., 0]


def logit_drift(
    p: ArrayLike,
    p_ref: ArrayLike,
    beta: ArrayLike,
    estimator: str,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Expected gradient of the sampled GRPO objective in the success logit.

    Two-outcome bandit (one success, one failure), reference KL only
    (``alpha = 1``), at ``pi = pi_old`` with PoS ``p`` and success logit ``L``:

    - surrogate: ``p (1 - p) Omega(p)`` (the calibrated advantage);
    - forward KL (exact, k2, k3_ratio): ``- beta p (1 - p) (L - L_ref)``;
    - reverse KL (k3): ``- beta (p - p_ref)``;
    - k1: ``0``.

    A sampled run with small steps drifts up where this is positive and down
    where it is negative; it settles at a zero where the drift decreases.
    """
    _check_estimator(estimator)
    pp = check_probability("p", p)
    pr = check_probability("p_ref", p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    pp, pr, b = broadcast(p=pp, p_ref=pr, beta=b)
    lp, lr = logit(pp), logit(pr)
    log_var = _log_bernoulli_variance(lp)
    var = np.exp(log_var)
    if cal.undefined_at_boundary:
        # eps = 0: p (1 - p) Omega(p) = sqrt(p (1 - p)), formed in log space (Omega alone
        # overflows beyond |logit p| = 1419) and 0 at p in {0, 1}
        inner = np.isfinite(lp)
        safe = np.where(inner, lp, 0.0)
        push = np.where(inner, np.exp(log_var + cal.log_omega_unchecked(safe)), 0.0)
    else:
        push = var * cal.omega_unchecked(lp)
    target = ESTIMATOR_TARGETS[estimator]
    if target == "forward":
        with np.errstate(invalid="ignore"):
            pull = np.where(var > 0, var * (lp - lr), 0.0)
    elif target == "reverse":
        pull = pp - pr
    else:
        pull = np.zeros_like(push)
    return push - b * pull


def reverse_kl_fixed_points(
    p_ref: ArrayLike,
    beta: ArrayLike,
    *,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> np.ndarray:
    """Every interior PoS fixed point of GRPO with a reverse-KL anchor, increasing.

    Solves ``p (1 - p) Omega(p) = beta (p - p_ref)`` (the zeros of
    :func:`logit_drift` for ``"k3"``), equivalently ``p`` is the PoS of
    :func:`reverse_kl_policy` with the weights evaluated at ``p`` itself.
    Roots are bracketed on a fine logit grid and refined with Brent's method.
    For the population calibration with ``eps = 0`` the root is unique and has
    a closed form (see the tests).

    Returns
    -------
    ndarray
        1-D for scalar arguments; otherwise the broadcast shape plus a
        trailing axis padded with NaN. ``p_ref`` in {0, 1} gives no interior
        root (0 and 1 are absorbing).
    """
    pr = check_probability("p_ref", p_ref)
    b = check_beta(beta)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    pr, b = broadcast(p_ref=pr, beta=b)
    grid = np.linspace(-60.0, 60.0, 24001)

    def scaled(x: ArrayLike, pr_: float, b_: float) -> np.ndarray:
        # Omega(p) / beta - (p - p_ref) / (p (1 - p)): same zeros, finite in logit space
        x = np.asarray(x, dtype=np.float64)
        var = np.exp(_log_bernoulli_variance(x))
        return cal.omega_of_logit(x) / b_ - (sigmoid(x) - pr_) / var

    # the grid's Omega and p (1 - p) do not depend on p_ref or beta: computed once
    grid_omega = cal.omega_of_logit(grid)
    grid_var = np.exp(_log_bernoulli_variance(grid))
    grid_p = sigmoid(grid)
    rows = []
    for pr_, b_ in zip(pr.ravel(), b.ravel(), strict=True):
        roots: list[float] = []
        if 0.0 < pr_ < 1.0:
            sign = np.sign(grid_omega / float(b_) - (grid_p - float(pr_)) / grid_var)
            for i in np.flatnonzero(sign[:-1] * sign[1:] < 0):
                x = optimize.brentq(lambda z, a=float(pr_), c=float(b_): float(scaled(z, a, c)),
                                    grid[i], grid[i + 1], xtol=1e-13,
                                    rtol=4 * np.finfo(float).eps)
                roots.append(float(sigmoid(x)))
        rows.append(roots)
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    if pr.ndim == 0:
        return out[0]
    return out.reshape(*pr.shape, width)
