"""The theory's answer to each question a practitioner asks of a TRL ``GRPOConfig``.

Every function takes the configuration itself (``args``: a ``trl.GRPOConfig``, or any
object with its attribute names) and reads it through the one bridge from TRL to the
theory, :func:`~grpo_companion.practice.trl_bridge.theory_reading` (with
:func:`~grpo_companion.practice.trl_bridge.loss_settings` for the clip and the loss
type). The answers are for the two-outcome bandit of the paper (one prompt, success with
PoS ``p``, success logit ``L``), where they are exact:

- what advantage does TRL compute? :func:`advantage_table` (``scale_rewards="group"``
  or ``"none"``: the finite-group calibration) and :func:`batch_scaled_advantages`
  (``"batch"``: no per-prompt calibration);
- which way does the PoS drift, and where does it settle? :func:`expected_drift` and
  :func:`fixed_point`;
- what does batch scaling do to a prompt? :func:`batch_weights` and
  :func:`batch_fixed_point`, with the other prompts of the batch at PoS ``q``;
- what do completion lengths do under ``loss_type``? :func:`length_fixed_point`;
- what does one generation round of ``num_iterations`` steps with the clip of
  ``epsilon``/``epsilon_high`` do? :func:`round_step`;
- :func:`compare_round` holds TRL's rounds against :func:`round_step`;
- where did my run settle? :func:`settled_pos`, from a
  :class:`~grpo_companion.practice.trl_callback.PoSProbeCallback`.

TRL's own answer to the same questions, from its ``_compute_loss`` and advantage code,
is :class:`~grpo_companion.practice.trl_bandit.TRLBandit`'s; :func:`compare_drift`,
:func:`compare_batch`, :func:`compare_lengths` and :func:`compare_round` put the two side
by side for one configuration. ``tests/practice/test_trl_questions.py``
holds every function here against TRL's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats

from grpo_companion import theory
from grpo_companion.practice.trl_bridge import (
    TRL_STD_EPS,
    TheoryReading,
    advantage_calibration,
    loss_settings,
    theory_reading,
)
from grpo_companion.theory import kl_estimators
from grpo_companion.theory.finite_group import group_table

__all__ = [
    "BatchComparison",
    "DriftComparison",
    "LengthComparison",
    "RoundComparison",
    "advantage_table",
    "batch_fixed_point",
    "batch_scaled_advantages",
    "batch_weights",
    "compare_batch",
    "compare_drift",
    "compare_lengths",
    "compare_round",
    "expected_drift",
    "fixed_point",
    "length_fixed_point",
    "round_step",
    "settled_pos",
]


# --------------------------------------------------------------------------- checks
def _probability(value: Any, name: str, *, open_interval: bool = False) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a probability or an array of them, got "
                         f"{value!r}") from err
    if isinstance(value, bool | str) or arr.dtype == bool:
        raise ValueError(f"{name} must be a probability, got {value!r}")
    low_ok = arr > 0 if open_interval else arr >= 0
    high_ok = arr < 1 if open_interval else arr <= 1
    if not np.all(np.isfinite(arr) & low_ok & high_ok):
        where = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name} must lie in {where}, got {value!r}")
    return arr


def _scalar_probability(value: Any, name: str) -> float:
    arr = _probability(value, name, open_interval=True)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a single probability in (0, 1), got {value!r}")
    return float(arr)


def _reading(args: Any, *, need_calibration: bool = True) -> TheoryReading:
    if args is None or not hasattr(args, "num_generations"):
        raise ValueError(f"args must be a trl.GRPOConfig (or an object with its fields), "
                         f"got {args!r}")
    reading = theory_reading(args)
    if need_calibration and not reading.predicts:
        raise ValueError("args has no per-prompt prediction: " + "; ".join(reading.reasons))
    return reading


def _forward_anchor(reading: TheoryReading, what: str) -> None:
    if reading.beta <= 0:
        raise ValueError(f"{what} needs a KL anchor: args.beta must be > 0, got "
                         f"{reading.beta!r}")
    if reading.kl_target != "forward":
        raise ValueError(f"{what} is derived for KL(pi || pi_ref): args.use_bias_correction_kl "
                         f"must be True (the estimator 'k3_ratio'), got the estimator "
                         f"{reading.kl!r}")


# ---------------------------------------------------------------------- advantages
def advantage_table(args: Any) -> tuple[np.ndarray, np.ndarray]:
    """The advantages the theory says TRL computes for a group with ``k`` successes.

    Returns ``(plus, minus)``, each of shape ``(G + 1,)`` for ``k = 0..G``
    (``G = num_generations``): the advantage of a success and minus that of a failure,
    from the calibration of ``scale_rewards`` (``"group"``: Bessel-corrected group
    standard deviation plus ``1e-4``; ``"none"``: centring only) via
    :func:`grpo_companion.theory.finite_group.group_table`. ``scale_rewards="batch"`` has
    no such table (a ``ValueError``; see :func:`batch_scaled_advantages`).
    """
    reading = _reading(args)
    return group_table(reading.calibration, reading.group_size)


def _batch_scale(total: Any, n_total: int) -> np.ndarray:
    """TRL's batch standard deviation (Bessel) of ``total`` successes among ``n_total``
    0/1 rewards, plus its ``1e-4``."""
    return np.sqrt(total * (n_total - total) / (n_total * (n_total - 1))) + TRL_STD_EPS


def batch_scaled_advantages(rewards: Any) -> np.ndarray:
    """TRL's advantages under ``scale_rewards="batch"``, for 0/1 rewards of one batch.

    ``rewards`` has shape ``(n_prompts, G)``, one row per group. Each reward minus its
    group's mean, divided by the standard deviation of all ``N = n_prompts G`` rewards
    (Bessel-corrected, as TRL's ``nanstd``) plus ``1e-4``; for 0/1 rewards with ``T``
    successes in all that deviation is ``sqrt(T (N - T) / (N (N - 1)))``. A group's
    advantages thus depend on the other groups of its batch.
    """
    arr = np.asarray(rewards)
    if arr.ndim != 2 or arr.size < 2 or not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"rewards must be a (n_prompts, G) array of 0/1 rewards with at "
                         f"least two entries, got {rewards!r}")
    return (arr - arr.mean(1, keepdims=True)) / _batch_scale(arr.sum(), arr.size)


def _batch_shape(args: Any) -> tuple[int, int]:
    group = int(args.num_generations)
    n_total = int(getattr(args, "generation_batch_size", None)
                  or args.per_device_train_batch_size)
    if group < 2 or n_total % group:
        raise ValueError(f"args must hold whole groups of num_generations >= 2 in its "
                         f"generation batch, got num_generations={group}, batch {n_total}")
    return n_total // group, group


def _batch_weights_one(p: float, q: float, n_prompts: int, group: int) -> tuple[float, float]:
    n_total = n_prompts * group
    j = np.arange(group)[:, None]  # successes among the other G - 1 samples of the group
    pmf_j = stats.binom.pmf(j, group - 1, p)
    others = np.arange((n_prompts - 1) * group + 1)[None, :]  # successes in the other groups
    pmf_o = stats.binom.pmf(others, (n_prompts - 1) * group, q)
    w_plus = np.sum(pmf_j * pmf_o * (1 - (j + 1) / group) / _batch_scale(j + 1 + others, n_total))
    w_minus = np.sum(pmf_j * pmf_o * (j / group) / _batch_scale(j + others, n_total))
    return float(w_plus), float(w_minus)


def batch_weights(p: Any, q: Any, args: Any) -> tuple[np.ndarray, np.ndarray]:
    """Expected weights ``(w+, w-)`` of a prompt under ``scale_rewards="batch"``.

    The prompt has PoS ``p``; the other ``B - 1`` prompts of its generation batch
    (``B = generation_batch_size / num_generations``) have PoS ``q`` each. ``w+`` is the
    expected advantage of one of the prompt's samples given that it succeeds, ``w-``
    minus that given that it fails, exactly: a binomial sum over the successes of the
    rest of its group and of the other groups, with :func:`batch_scaled_advantages`'s
    formula. With group scaling these would be the calibration's finite-group weights;
    here they depend on ``q``. ``p`` and ``q`` broadcast; arrays of that shape come back.
    """
    p_arr = _probability(p, "p")
    q_arr = _probability(q, "q")
    n_prompts, group = _batch_shape(args)
    p_b, q_b = np.broadcast_arrays(p_arr, q_arr)
    out = np.array([_batch_weights_one(float(a), float(b), n_prompts, group)
                    for a, b in zip(p_b.ravel(), q_b.ravel(), strict=True)]).reshape(
        *p_b.shape, 2)
    return out[..., 0], out[..., 1]


def batch_fixed_point(p_ref: float, q: float, args: Any) -> float:
    """Fixed point of a prompt under ``scale_rewards="batch"``, the rest of its batch at ``q``.

    The paper's map in logits, ``L = L_ref + Omega(p; q) / beta``, with the total weight
    ``Omega(p; q) = w+ + w-`` of :func:`batch_weights` (Theorem 2's fixed-point condition
    with the batch's weights in place of a calibration's), solved by Brent's method in
    ``L`` on ``[-30, 30]`` to 1e-12. The other prompts are held still, which a real
    batch is not: the answer says how far the batch's composition moves a prompt's
    limit, not where a coupled run goes.
    """
    p_ref = _scalar_probability(p_ref, "p_ref")
    q = float(_probability(q, "q"))
    reading = _reading(args, need_calibration=False)
    _forward_anchor(reading, "batch_fixed_point")
    n_prompts, group = _batch_shape(args)
    beta = reading.beta

    def gap(x: float) -> float:
        w_plus, w_minus = _batch_weights_one(float(theory.sigmoid(x)), q, n_prompts, group)
        return x - math.log(p_ref / (1 - p_ref)) - (w_plus + w_minus) / beta

    return float(theory.sigmoid(optimize.brentq(gap, -30, 30, xtol=1e-12)))


@dataclass(frozen=True)
class BatchComparison:
    """``scale_rewards="batch"`` measured on TRL and worked out (see :func:`compare_batch`).

    Attributes
    ----------
    formula_gap : float
        Largest difference between TRL's advantages of random batches and
        :func:`batch_scaled_advantages`.
    q : numpy.ndarray
        PoS of the other prompts of the batch.
    omega_batch, fp_batch : numpy.ndarray
        The prompt's total weight ``w+ + w-`` (:func:`batch_weights`) and its fixed point
        (:func:`batch_fixed_point`) for each ``q``.
    omega_group, fp_group : float
        The same under group scaling (``scale_rewards="group"``, same group size and KL).
    """

    formula_gap: float
    q: np.ndarray
    omega_batch: np.ndarray
    fp_batch: np.ndarray
    omega_group: float
    fp_group: float


def compare_batch(bandit: Any, p_ref: float, q: Any, *, seed: int = 0,
                  n_batches: int = 5) -> BatchComparison:
    """Batch scaling on TRL's code and in the theory, for a prompt with reference PoS ``p_ref``.

    ``bandit`` is a :class:`~grpo_companion.practice.trl_bandit.TRLBandit` whose
    configuration has ``scale_rewards="batch"``. ``n_batches`` random batches of 0/1
    rewards (from ``numpy.random.default_rng(seed)``: per batch a PoS per prompt, then
    the rewards) are scored by TRL and by :func:`batch_scaled_advantages`; then the
    prompt's weights and fixed point are worked out for each PoS ``q`` of the other
    prompts, next to group scaling's.
    """
    args = bandit.trainer.args
    reading = _reading(args, need_calibration=False)
    if str(args.scale_rewards) != "batch":
        raise ValueError(f"bandit must be configured with scale_rewards='batch', got "
                         f"{args.scale_rewards!r}")
    p_ref = _scalar_probability(p_ref, "p_ref")
    q = np.atleast_1d(_probability(q, "q"))
    if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 1:
        raise ValueError(f"n_batches must be an int >= 1, got {n_batches!r}")
    n_prompts, group = _batch_shape(args)
    rng = np.random.default_rng(seed)
    gap = 0.0
    for _ in range(n_batches):
        rewards = (rng.random((n_prompts, group)) < rng.random((n_prompts, 1))).astype(int)
        theirs = bandit.advantages(rewards.ravel()).numpy().reshape(n_prompts, group)
        gap = max(gap, float(np.abs(theirs - batch_scaled_advantages(rewards)).max()))
    group_cal = advantage_calibration("group", group)
    return BatchComparison(
        formula_gap=gap, q=q, omega_batch=np.add(*batch_weights(p_ref, q, args)),
        fp_batch=np.array([batch_fixed_point(p_ref, float(x), args) for x in q]),
        omega_group=float(sum(group_cal.weights(p_ref))),
        fp_group=float(theory.fixed_points(p_ref, reading.beta, calibration=group_cal)[0]))


# ------------------------------------------------------------------ drift and limit
def expected_drift(p: Any, p_ref: float, args: Any) -> np.ndarray:
    """Minus the expected gradient of TRL's loss in the success logit, on policy.

    ``p(1 - p) Omega_G(p)`` from the advantages (the finite-group weights of the
    configuration's calibration), minus the KL term's pull: ``beta p (1 - p) (L - L_ref)``
    for ``use_bias_correction_kl=True`` (it follows ``KL(pi || pi_ref)``, the paper's
    penalty) or ``beta (p - p_ref)`` for plain k3 (``KL(pi_ref || pi)``), as
    :func:`grpo_companion.theory.kl_estimators.logit_drift`; with ``beta = 0`` only the
    first term, positive on all of ``(0, 1)``. Its zeros are :func:`fixed_point`.
    """
    reading = _reading(args)
    p = _probability(p, "p")
    p_ref = _scalar_probability(p_ref, "p_ref")
    if reading.beta > 0:
        return kl_estimators.logit_drift(p, p_ref, reading.beta, reading.kl,
                                         calibration=reading.calibration)
    w_plus, w_minus = reading.calibration.weights(p)
    return p * (1 - p) * (w_plus + w_minus)


def fixed_point(p_ref: float, args: Any) -> float | None:
    """Where the theory says a prompt with reference PoS ``p_ref`` settles under ``args``.

    The lowest interior zero of :func:`expected_drift`: the paper's fixed point
    (:func:`grpo_companion.theory.fixed_points`, Theorem 2) when the KL estimator follows
    ``KL(pi || pi_ref)``, the reverse-KL one
    (:func:`grpo_companion.theory.kl_estimators.reverse_kl_fixed_points`) for plain k3;
    ``None`` for ``beta = 0``, where the drift has no interior zero and the PoS goes to 1,
    and with a moving reference (``sync_ref_model=True``, ``reading.moving_reference``),
    whose logit rises with the policy's at every sync, so that the PoS goes to 1 as well
    (:func:`grpo_companion.practice.trl_bridge.predict_limits`); :func:`expected_drift` is
    then the drift against the reference in force, ``p_ref``.
    """
    reading = _reading(args)
    p_ref = _scalar_probability(p_ref, "p_ref")
    if reading.beta == 0 or reading.moving_reference:
        return None
    find = (theory.fixed_points if reading.kl_target == "forward"
            else kl_estimators.reverse_kl_fixed_points)
    return float(find(p_ref, reading.beta, calibration=reading.calibration)[0])


@dataclass(frozen=True)
class DriftComparison:
    """TRL's expected drift and fixed point next to the theory's (see :func:`compare_drift`).

    Attributes
    ----------
    reading : TheoryReading
        The theory's reading of the configuration.
    table_gap : float
        Largest difference between TRL's advantages and :func:`advantage_table`.
    p : numpy.ndarray
        The PoS grid.
    measured, predicted : numpy.ndarray
        TRL's exact expected drift and :func:`expected_drift` on ``p``.
    drift_gap : float
        Their largest difference.
    trl_fp, theory_fp : float or None
        The zero of TRL's expected drift and :func:`fixed_point` (``None``: no zero).
    """

    reading: TheoryReading
    table_gap: float
    p: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray
    drift_gap: float
    trl_fp: float | None
    theory_fp: float | None


def compare_drift(bandit: Any, p_ref: float, p: Any) -> DriftComparison:
    """TRL's advantages, drift and fixed point against the theory's, for one ``GRPOConfig``.

    ``bandit`` is a :class:`~grpo_companion.practice.trl_bandit.TRLBandit`, whose trainer's
    ``args`` is the configuration; TRL's side comes from its ``table``, ``drift`` and
    ``fixed_point``, the theory's from :func:`advantage_table`, :func:`expected_drift`
    and :func:`fixed_point`.
    """
    args = bandit.trainer.args
    reading = _reading(args)
    p_ref = _scalar_probability(p_ref, "p_ref")
    grid = _probability(p, "p", open_interval=True)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"p must be a non-empty 1-D grid of PoS values, got {p!r}")
    table = bandit.table()
    plus, minus = advantage_table(args)
    table_gap = max(np.abs(table[0].numpy() - plus).max(), np.abs(table[1].numpy() - minus).max())
    measured = np.array([bandit.drift(x, p_ref, table) for x in grid])
    predicted = expected_drift(grid, p_ref, args)
    return DriftComparison(
        reading=reading, table_gap=float(table_gap), p=grid, measured=measured,
        predicted=predicted, drift_gap=float(np.abs(measured - predicted).max()),
        trl_fp=bandit.fixed_point(p_ref, table), theory_fp=fixed_point(p_ref, args))


# ------------------------------------------------------------------------ loss_type
def length_fixed_point(p_ref: float, args: Any, lengths: tuple[int, int]) -> float | None:
    """The fixed point under ``args.loss_type`` when a success has ``lengths[0]`` tokens
    and a failure ``lengths[1]`` (only the first token is the policy's choice).

    - equal lengths, or ``"dr_grpo"`` (a constant normaliser changes the step, not the
      objective): :func:`fixed_point`;
    - ``"grpo"`` (each completion's tokens averaged, so a completion of length ``l``
      weighs ``1 / l``): the zero in ``p`` of
      ``w+/l_S + w-/l_F - beta [log(p / p_ref) / l_S - log((1 - p) / (1 - p_ref)) / l_F]``,
      the paper's condition ``Omega = beta (L - L_ref)`` with those weights (Brent's
      method in ``L`` on ``[-30, 30]`` to 1e-13; needs ``use_bias_correction_kl=True``
      and ``beta > 0``);
    - ``"bnpo"`` and ``"dapo"`` with unequal lengths: ``None``. Their normaliser, the
      token count of the batch, varies with its number of successes and couples the
      samples; no per-prompt formula is given.
    """
    p_ref = _scalar_probability(p_ref, "p_ref")
    if (not isinstance(lengths, tuple | list) or len(lengths) != 2
            or not all(isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 1
                       for n in lengths)):
        raise ValueError(f"lengths must be two integers >= 1 (success, failure), got "
                         f"{lengths!r}")
    reading = _reading(args)
    loss_type = loss_settings(args)["loss_type"]
    l_s, l_f = int(lengths[0]), int(lengths[1])
    if l_s == l_f or loss_type == "dr_grpo":
        return fixed_point(p_ref, args)
    if loss_type != "grpo":
        return None
    _forward_anchor(reading, "length_fixed_point with loss_type='grpo'")
    beta, calibration = reading.beta, reading.calibration

    def gap(x: float) -> float:
        p = float(theory.sigmoid(x))
        w_plus, w_minus = calibration.weights(p)
        pull = math.log(p / p_ref) / l_s - math.log((1 - p) / (1 - p_ref)) / l_f
        return float(w_plus / l_s + w_minus / l_f - beta * pull)

    return float(theory.sigmoid(optimize.brentq(gap, -30, 30, xtol=1e-13)))


@dataclass(frozen=True)
class LengthComparison:
    """Fixed points with equal and unequal completion lengths (see :func:`compare_lengths`).

    Attributes
    ----------
    loss_type : str
    lengths : tuple of int
        Tokens of a success and of a failure.
    trl_equal, trl_unequal : float or None
        Zeros of TRL's expected gradient with equal lengths and with ``lengths``.
    theory_equal, theory_unequal : float or None
        :func:`length_fixed_point` for the same (``None``: no formula).
    """

    loss_type: str
    lengths: tuple[int, int]
    trl_equal: float | None
    trl_unequal: float | None
    theory_equal: float | None
    theory_unequal: float | None


def compare_lengths(bandit: Any, p_ref: float, lengths: tuple[int, int]) -> LengthComparison:
    """TRL's fixed point under its ``loss_type`` with equal lengths and with ``lengths``
    (from :class:`~grpo_companion.practice.trl_bandit.TRLBandit`, whose
    ``max_completion_length`` must hold the longer), against :func:`length_fixed_point`."""
    args = bandit.trainer.args
    theory_unequal = length_fixed_point(p_ref, args, lengths)  # checks p_ref and lengths
    if max(lengths) > int(args.max_completion_length):
        raise ValueError(f"lengths {lengths!r} exceed the bandit's max_completion_length "
                         f"{args.max_completion_length}")
    table = bandit.table()
    return LengthComparison(
        loss_type=loss_settings(args)["loss_type"], lengths=(int(lengths[0]), int(lengths[1])),
        trl_equal=bandit.fixed_point(p_ref, table, (1, 1)),
        trl_unequal=bandit.fixed_point(p_ref, table, tuple(lengths)),
        theory_equal=length_fixed_point(p_ref, args, (1, 1)), theory_unequal=theory_unequal)


# ------------------------------------------------------------- one generation round
def round_step(p_prev: float, p_ref: float, args: Any) -> float:
    """PoS after one generation round solved, with TRL's clip (``epsilon``, ``epsilon_high``).

    The round samples with PoS ``p_prev`` and maximises, over the new PoS ``p``, the
    expected clipped surrogate with the weights ``w+``, ``w-`` of ``p_prev`` minus the
    KL penalty (exact, as ``use_bias_correction_kl=True`` makes it in expectation):
    ``w+ min(p, p_prev (1 + eps_high)) + w- min(p - 1, -(1 - p_prev)(1 - eps_low))
    - beta KL(p || p_ref)``. The clip caps how far one round moves up; a move down is not
    clipped. The objective is concave; its maximiser is found by a bounded scalar search
    on ``[1e-12, 1 - 1e-12]`` to 1e-13. When the clip cannot bind anywhere in ``(0, 1)``
    (``epsilon >= 1`` and ``p_prev (1 + epsilon_high) >= 1``) the round is Theorem 2's
    step, :func:`grpo_companion.theory.pos_map`, computed as such. Either way the fixed
    point is unchanged: there the ratio is 1 and no clip binds.
    """
    p_prev = _scalar_probability(p_prev, "p_prev")
    p_ref = _scalar_probability(p_ref, "p_ref")
    reading = _reading(args)
    _forward_anchor(reading, "round_step")
    clip = loss_settings(args)
    low, high = clip["clip_eps_low"], clip["clip_eps_high"]
    beta, calibration = reading.beta, reading.calibration
    if low >= 1 and p_prev * (1 + high) >= 1:
        return float(theory.pos_map(p_prev, p_ref, beta, calibration=calibration))
    w_plus, w_minus = (float(w) for w in calibration.weights(p_prev))
    cap_s, cap_f = p_prev * (1 + high), -(1 - p_prev) * (1 - low)

    def minus_objective(p: float) -> float:
        kl = p * math.log(p / p_ref) + (1 - p) * math.log((1 - p) / (1 - p_ref))
        return -(w_plus * min(p, cap_s) + w_minus * min(p - 1, cap_f) - beta * kl)

    return float(optimize.minimize_scalar(minus_objective, bounds=(1e-12, 1 - 1e-12),
                                          method="bounded", options={"xatol": 1e-13}).x)


@dataclass(frozen=True)
class RoundComparison:
    """One generation round of TRL's loss against the theory's (see :func:`compare_round`).

    Attributes
    ----------
    clip_low, clip_high : float
        ``epsilon`` and ``epsilon_high`` (which defaults to ``epsilon``).
    mu : tuple of int
        The numbers of gradient steps per round tried.
    stepped : numpy.ndarray
        TRL's PoS after one round of each ``mu``.
    solved : float
        TRL's round solved (the minimiser of the round's loss).
    predicted : float
        :func:`round_step`.
    """

    clip_low: float
    clip_high: float
    mu: tuple[int, ...]
    stepped: np.ndarray
    solved: float
    predicted: float


def compare_round(bandit: Any, p_ref: float, mu_values: Any) -> RoundComparison:
    """One round from ``p_ref`` of TRL's loss (``bandit``, a
    :class:`~grpo_companion.practice.trl_bandit.TRLBandit`) with each number of gradient
    steps in ``mu_values`` and solved, against :func:`round_step` for its ``GRPOConfig``."""
    p_ref = _scalar_probability(p_ref, "p_ref")
    mu = tuple(mu_values)
    if not mu:
        raise ValueError(f"mu_values must hold at least one step count, got {mu_values!r}")
    args = bandit.trainer.args
    clip = loss_settings(args)
    table = bandit.table()
    return RoundComparison(
        clip_low=clip["clip_eps_low"], clip_high=clip["clip_eps_high"], mu=mu,
        stepped=np.array([bandit.round_pos(p_ref, p_ref, m, table) for m in mu]),
        solved=bandit.round_pos(p_ref, p_ref, None, table),
        predicted=round_step(p_ref, p_ref, args))


# ------------------------------------------------------------------- a run's level
def settled_pos(probe: Any, from_step: float) -> tuple[np.ndarray, np.ndarray]:
    """Where a run settled: each prompt's mean measured PoS from ``from_step`` on.

    ``probe`` is a :class:`~grpo_companion.practice.trl_callback.PoSProbeCallback` after
    (or during) training; its measurements at steps ``>= from_step`` are averaged per
    prompt. Returns ``(mean, standard_error)``, the error from the spread of those
    measurements over the steps (``ddof=1``), so at least two steps are needed. This
    is the level the theory's limit speaks to: a real run reaches it later than the
    idealised recurrence and then fluctuates around it.
    """
    if isinstance(from_step, bool) or not isinstance(from_step, int | float) \
            or not math.isfinite(from_step):
        raise ValueError(f"from_step must be a finite number, got {from_step!r}")
    rows = getattr(probe, "rows", None)
    if rows is None:
        raise ValueError(f"probe must be a PoSProbeCallback with measured rows, got {probe!r}")
    steps = np.array(sorted({r["step"] for r in rows}))
    late = steps[steps >= from_step]
    if late.size < 2:
        raise ValueError(f"from_step={from_step!r} leaves {late.size} measured step(s); "
                         "at least 2 are needed for a standard error")
    pos = np.array([[r["measured_pos"] for r in rows if r["step"] == s] for s in late])
    return pos.mean(0), pos.std(0, ddof=1) / math.sqrt(len(late))
