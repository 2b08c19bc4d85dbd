"""What a TRL ``GRPOConfig`` means in this project's vocabulary.

Two translations, both checked against TRL's own code by
``tests/practice/test_trl_equivalence.py`` (TRL 1.16.0):

- :func:`loss_settings`: the keywords of :func:`grpo_companion.rl.losses.grpo_loss`
  that give the loss ``GRPOTrainer._compute_loss`` computes. TRL's ``epsilon`` and
  ``epsilon_high`` are our ``clip_eps_low`` and ``clip_eps_high``; ``beta`` is
  ``beta``; ``use_bias_correction_kl=False`` is the plain ``"k3"`` estimator and
  ``True`` (TRL's default) is ``"k3_ratio"``, k3 times the differentiated ratio
  ``pi / pi_old``. Options our loss does not have (two-sided ``delta``, entropy
  masks or bonuses, off-policy masks, vLLM importance weights, sequence-level
  ratios, the other loss types) are refused rather than silently ignored.
- :func:`theory_reading`: what :mod:`grpo_companion.theory` makes of a configuration
  (a :class:`TheoryReading`), and so what it predicts for a run.
  ``scale_rewards="group"`` is ``CALIBRATIONS["trl"]`` (Bessel-corrected group
  standard deviation plus TRL's fixed ``1e-4``) and ``"none"`` is
  ``CALIBRATIONS["mean_only"]``, each with ``group_size = num_generations`` so
  that the finite-group weights are used; ``"batch"`` scales by a statistic of
  the whole batch, which couples the prompts, so there is no per-prompt
  prediction. Neither is there for any other setting that
  :mod:`grpo_companion.practice.trl_coverage` puts outside the theory (an
  entropy bonus, several rewards, another loss, sequence-level ratios, truncated
  sampling, ...): ``TheoryReading.predicts`` is then False and
  ``TheoryReading.reasons`` says why, one ``"name=value: why"`` per setting.

A moving reference (``sync_ref_model=True``: TRL's ``SyncRefModelCallback`` sets the
reference's parameters to ``a theta + (1 - a) theta_ref``, ``a = ref_model_mixup_alpha``,
after every ``ref_model_sync_steps``-th optimiser step) is predicted by the
moving-reference recurrence (:func:`grpo_companion.theory.analyses.staged.moving_reference_iterate`)
when it syncs after a whole number of iterations and the KL follows ``KL(pi || pi_ref)``;
``TheoryReading.ref_sync_every`` and ``ref_mixup_alpha`` carry it. The recurrence is exact
for a tabular policy (the logits are the parameters, so the mix mixes log-probabilities);
for a network it is the same idealisation as the rest of the bridge.

Which KL the run follows. On the samples of the current policy, the expected
gradient of ``"k3_ratio"`` is the gradient of ``KL(pi || pi_ref)``, the penalty
of the paper's objective (eq. 6), whose iterations are the recurrence of
Theorem 2; the expected gradient of plain ``"k3"`` is that of
``KL(pi_ref || pi)`` (:mod:`grpo_companion.theory.kl_estimators`). TRL's help
text calls the first one "reverse KL" (the usual name in RL, with the policy
first); this project calls it the forward KL (``ESTIMATOR_TARGETS["k3_ratio"] ==
"forward"``). Same divergence, opposite names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_companion import theory
from grpo_companion.practice.trl_coverage import (
    outside_reasons,
    ref_sync_iterations,
    steps_per_iteration,
)
from grpo_companion.theory.analyses.staged import mixed_reference_logit
from grpo_companion.theory.calibration import Calibration
from grpo_companion.theory.kl_estimators import ESTIMATOR_TARGETS, reverse_kl_pos

__all__ = [
    "LOSS_TYPES",
    "PredictedPath",
    "TheoryReading",
    "advantage_calibration",
    "iteration_of_step",
    "loss_settings",
    "predict_limits",
    "predict_path",
    "theory_reading",
]

#: TRL loss types with a counterpart in :func:`grpo_companion.rl.losses.aggregate`.
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

#: TRL's fixed smoothing constant of the group standard deviation (``std + 1e-4``).
TRL_STD_EPS = 1e-4


def _get(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def loss_settings(args: Any) -> dict[str, Any]:
    """Keywords of :func:`~grpo_companion.rl.losses.grpo_loss` for a ``GRPOConfig``.

    Raises ``ValueError`` for a setting whose loss we do not reproduce.
    """
    loss_type = _get(args, "loss_type", "dapo")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r} has no counterpart here; supported: "
                         f"{LOSS_TYPES}")
    unsupported = []
    if _get(args, "delta") is not None:
        unsupported.append("delta (two-sided clipping)")
    if _get(args, "importance_sampling_level", "token") != "token":
        unsupported.append("importance_sampling_level != 'token'")
    if _get(args, "top_entropy_quantile", 1.0) < 1.0:
        unsupported.append("top_entropy_quantile < 1")
    if _get(args, "entropy_coef", 0.0) != 0.0 or _get(args, "use_adaptive_entropy", False):
        unsupported.append("an entropy bonus")
    if _get(args, "off_policy_mask_threshold") is not None:
        unsupported.append("off_policy_mask_threshold")
    if _get(args, "use_vllm", False) and _get(args, "vllm_importance_sampling_correction", False):
        unsupported.append("vLLM importance-sampling correction")
    if unsupported:
        raise ValueError("our loss has no counterpart for " + ", ".join(unsupported))
    eps_low = float(args.epsilon)
    eps_high = _get(args, "epsilon_high")
    return {
        "clip_eps_low": eps_low,
        "clip_eps_high": eps_low if eps_high is None else float(eps_high),
        "beta": float(args.beta),
        "kl": "k3_ratio" if _get(args, "use_bias_correction_kl", False) else "k3",
        "loss_type": loss_type,
        "max_completion_length": int(args.max_completion_length),
    }


def advantage_calibration(scale_rewards: Any, group_size: int | None = None) -> Calibration | None:
    """The calibration of TRL's ``scale_rewards`` (``None`` for ``"batch"``).

    ``True``/``"group"``: ``CALIBRATIONS["trl"]``; ``False``/``"none"``:
    ``CALIBRATIONS["mean_only"]``; with ``group_size`` set, the finite-group version
    (:mod:`grpo_companion.theory.finite_group`).
    """
    mode = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
    if mode == "batch":
        return None
    if mode not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    cal = theory.CALIBRATIONS["trl" if mode == "group" else "mean_only"]
    return cal if group_size is None else dataclasses.replace(cal, group_size=group_size)


@dataclass(frozen=True)
class TheoryReading:
    """What the theory makes of a ``GRPOConfig`` (see :func:`theory_reading`).

    The one object for "this configuration, as the theory sees it": the prediction
    functions of this module take it, and
    :func:`~grpo_companion.practice.trl_facts.installed_reading` builds it from the installed
    TRL's defaults.

    Attributes
    ----------
    beta : float
        KL weight; 0 means no anchor.
    calibration : Calibration or None
        With ``group_size = G``; ``None`` when there is no per-prompt prediction.
    kl : str
        ``"k3"`` or ``"k3_ratio"``, the estimator the loss uses.
    kl_target : str
        ``"forward"`` (``KL(pi || pi_ref)``, the paper's) or ``"reverse"``
        (``KL(pi_ref || pi)``), what that estimator's expected gradient follows.
    group_size : int
        ``num_generations``.
    steps_per_iteration : float
        Optimiser steps per GRPO iteration (one generation round: sample with
        ``pi_{n-1}``, then ``num_iterations`` passes), see :func:`iteration_of_step`.
    note : str
        One line on what is predicted, for the run's record; ``"no per-prompt
        prediction: "`` followed by the reasons when there is none.
    reasons : tuple of str
        Why there is no per-prompt prediction, one ``"name=value: why"`` per setting
        outside the theory (:func:`~grpo_companion.practice.trl_coverage.outside_reasons`);
        empty when there is one.
    ref_sync_every : int or None
        With ``sync_ref_model=True``: GRPO iterations between two syncs of the reference
        (:func:`~grpo_companion.practice.trl_coverage.ref_sync_iterations`); ``None``: the
        reference stays ``pi_ref``.
    ref_mixup_alpha : float
        The policy's share of the reference at each sync (``ref_model_mixup_alpha``; 1.0
        without a sync).
    scale_rewards : str or None
        ``"group"``, ``"batch"`` or ``"none"`` (booleans normalised as TRL does).
    mu : int or None
        ``num_iterations``.
    clip_low, clip_high : float or None
        ``epsilon`` and ``epsilon_high`` (which defaults to ``epsilon``).
    loss_type : str or None
    temperature, learning_rate : float or None
        These five describe the configuration without changing the prediction; ``None``
        where the configuration lacks the field.
    trl_version : str or None
        Of the installed TRL when built by
        :func:`~grpo_companion.practice.trl_facts.installed_reading`; ``None`` otherwise.
    """

    beta: float
    calibration: Calibration | None
    kl: str
    kl_target: str
    group_size: int
    steps_per_iteration: float
    note: str
    reasons: tuple[str, ...] = ()
    ref_sync_every: int | None = None
    ref_mixup_alpha: float = 1.0
    scale_rewards: str | None = None
    mu: int | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    loss_type: str | None = None
    temperature: float | None = None
    learning_rate: float | None = None
    trl_version: str | None = None

    @property
    def predicts(self) -> bool:
        """Whether there is a per-prompt recurrence (not with batch-level scaling, nor with
        any other setting outside the theory: see ``reasons``)."""
        return self.calibration is not None and not self.reasons

    def record(self) -> dict[str, Any]:
        """The fields a run's record keeps, as plain JSON-ready values."""
        cal = None if self.calibration is None else dataclasses.asdict(self.calibration)
        out = {"beta": self.beta, "calibration": cal, "kl": self.kl,
               "kl_target": self.kl_target, "group_size": self.group_size,
               "steps_per_iteration": self.steps_per_iteration, "note": self.note,
               "reasons": list(self.reasons)}
        if self.ref_sync_every is not None:  # a fixed reference keeps the older record
            out.update(ref_sync_every=self.ref_sync_every, ref_mixup_alpha=self.ref_mixup_alpha)
        return out

    @property
    def moving_reference(self) -> bool:
        """True when the prediction is the moving-reference recurrence (``sync_ref_model``)."""
        return (self.predicts and self.beta != 0 and self.kl_target == "forward"
                and self.ref_sync_every is not None)

    @property
    def kl_active(self) -> bool:
        """``beta > 0``: the loss has a KL term."""
        return self.beta > 0

    @property
    def settles_at(self) -> str:
        """Where the theory says a run settles: in a few words."""
        if not self.predicts:
            return "no per-prompt prediction"
        if not self.kl_active:
            return "PoS 1 (no anchor)"
        if self.ref_sync_every is not None and self.kl_target == "forward":
            return "PoS 1 (the reference follows the policy: no fixed point)"
        return ("the paper's fixed point" if self.kl_target == "forward"
                else "the reverse-KL fixed point")


def theory_reading(args: Any) -> TheoryReading:
    """The theory's reading of a ``GRPOConfig`` (β, calibration, KL, G, iteration length).

    ``args`` is a ``GRPOConfig`` or an object with its attribute names; it needs
    ``num_generations``, ``beta`` and ``scale_rewards``
    (:func:`~grpo_companion.practice.trl_facts.installed_reading` fills the rest from the
    installed TRL). Every setting outside the theory
    (:func:`~grpo_companion.practice.trl_coverage.outside_reasons`, ``scale_rewards="batch"``
    among them) leaves the reading without a prediction: ``calibration`` is ``None``,
    ``predicts`` False and ``reasons`` lists them.
    """
    group = int(args.num_generations)
    beta = float(args.beta)
    # a config without the option is from a TRL before it existed, which computed plain k3
    kl = "k3_ratio" if _get(args, "use_bias_correction_kl", False) else "k3"
    cal = advantage_calibration(args.scale_rewards, group)
    reasons = outside_reasons(args)
    steps = steps_per_iteration(args)
    sync = ref_sync_iterations(args) if beta != 0 else None
    mixup = float(_get(args, "ref_model_mixup_alpha", 1.0)) if sync is not None else 1.0
    if mixup == 0:  # a = 0: the reference never moves, the fixed-reference prediction
        sync, mixup = None, 1.0
    if reasons or cal is None:  # cal is None for scale_rewards="batch", which is a reason
        cal = None
        note = "no per-prompt prediction: " + "; ".join(reasons)
    elif beta == 0:
        note = ("beta = 0: no KL term, each iteration maximises the expected advantage, so the "
                "theory predicts PoS 1 from the first iteration for every p_ref > 0 and 0 for "
                "p_ref = 0")
    elif ESTIMATOR_TARGETS[kl] == "forward":
        note = (f"paper's recurrence (Theorem 2) with KL(pi||pi_ref), beta={beta:g}, "
                f"{cal.normalization} calibration for groups of {group}")
    else:
        note = (f"k3 without the ratio follows KL(pi_ref||pi): reverse-KL analogue of the "
                f"recurrence (theory.kl_estimators.reverse_kl_pos), beta={beta:g}, "
                f"{cal.normalization} calibration for groups of {group}")
    if cal is not None and sync is not None:
        note += (f"; moving reference (sync_ref_model): its success logit mixed as "
                 f"a L_n + (1 - a) L_ref with a={mixup:g} every {sync} iteration(s) "
                 f"(theory.analyses.staged.moving_reference_iterate)")
    low, high = _get(args, "epsilon"), _get(args, "epsilon_high")
    scale = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)
    return TheoryReading(
        beta, cal, kl, ESTIMATOR_TARGETS[kl], group, steps, note, tuple(reasons), sync, mixup,
        scale_rewards=str(scale), mu=_optional(args, "num_iterations", int),
        clip_low=None if low is None else float(low),
        clip_high=(None if low is None else float(low)) if high is None else float(high),
        loss_type=_optional(args, "loss_type", str),
        temperature=_optional(args, "temperature", float),
        learning_rate=_optional(args, "learning_rate", float))


def _optional(args: Any, name: str, kind: Any) -> Any:
    value = _get(args, name)
    return None if value is None else kind(value)


def iteration_of_step(step: int, reading: TheoryReading) -> int:
    """The GRPO iteration (Algorithm 1's outer loop) that optimiser step ``step`` has completed.

    One iteration is one generation round of TRL: ``steps_per_generation x
    num_iterations`` micro-batches, i.e. ``steps_per_iteration`` optimiser steps.
    """
    return int(math.floor(step / reading.steps_per_iteration + 1e-9))


def _reverse_step(p: np.ndarray, p_ref: np.ndarray, reading: TheoryReading) -> np.ndarray:
    assert reading.calibration is not None
    w_plus, w_minus = reading.calibration.weights(p)
    return reverse_kl_pos(p_ref, w_plus, w_minus, reading.beta)


def predict_path(p_ref: Any, n_iterations: int, reading: TheoryReading) -> np.ndarray:
    """Predicted PoS after ``0..n_iterations`` GRPO iterations, shape ``(n + 1, n_prompts)``.

    Each iteration is the exact maximiser of that iteration's objective, started
    at ``pi_ref`` (the paper's idealisation). ``beta = 0`` has no anchor: the
    maximiser of the expected advantage is all mass on the verified outputs, so
    ``p_n = 1`` for ``n >= 1`` wherever ``p_ref > 0`` (0 stays 0). No division
    by ``beta`` happens in that case. NaN throughout when ``reading.predicts``
    is False.

    With plain k3 (``use_bias_correction_kl=False``) the path steps with the
    reverse-KL step (``theory.kl_estimators.reverse_kl_pos``). It shares two
    things with TRL's plain-k3 loss: the fixed points, and the gradient at
    ``pi = pi_old`` (so the first optimiser step of each round). It is not the
    optimum of a round of that loss, which is
    ``theory.analyses.trained_loss.round_step_logit`` and goes elsewhere (0.62 against
    0.69 from ``p_ref = 0.3`` at ``beta = 1``, ``G = 8``); no chapter measures
    that difference on TRL, so read only the limit as TRL's prediction there.

    With a moving reference (``reading.ref_sync_every``) the path is the moving-reference
    recurrence: after every ``ref_sync_every``-th iteration the reference's success logit
    becomes ``a L_n + (1 - a) L_ref`` (``a = reading.ref_mixup_alpha``).
    """
    p_ref = np.atleast_1d(np.asarray(p_ref, dtype=np.float64))
    n = int(n_iterations)
    if n < 0:
        raise ValueError(f"n_iterations must be >= 0, got {n_iterations!r}")
    if not reading.predicts:
        return np.full((n + 1, p_ref.size), np.nan)
    if reading.beta == 0:
        path = np.repeat(np.where(p_ref > 0, 1.0, 0.0)[None, :], n + 1, axis=0)
        path[0] = p_ref
        return path
    if reading.moving_reference:
        return PredictedPath(p_ref, reading).path(n)
    if reading.kl_target == "forward":
        return np.atleast_2d(theory.iterate(p_ref, p_ref, reading.beta, n,
                                            calibration=reading.calibration)).reshape(
            n + 1, p_ref.size)
    path = np.empty((n + 1, p_ref.size))
    path[0] = p_ref
    for i in range(1, n + 1):
        path[i] = _reverse_step(path[i - 1], p_ref, reading)
    return path


class PredictedPath:
    """:func:`predict_path` one iteration at a time, kept between calls.

    ``at(n)`` is ``predict_path(p_ref, n, reading)[-1]``, bit for bit, but it steps on
    from the last iteration asked for instead of starting again from ``p_ref``: asking
    for iterations ``n_1 <= n_2 <= ...`` costs ``max n`` steps of the recurrence in all,
    not ``sum n``. Asking for an earlier iteration starts again from ``p_ref``.
    ``steps`` counts the recurrence steps taken so far.
    """

    def __init__(self, p_ref: Any, reading: TheoryReading) -> None:
        self.p_ref = np.atleast_1d(np.asarray(p_ref, dtype=np.float64)).copy()
        self.reading = reading
        self.steps = 0
        self._forward = (reading.predicts and reading.beta != 0
                         and reading.kl_target == "forward")
        if self._forward:  # theory.iterate's own state: the logit, so that no round trip rounds
            self._logit_ref = theory.logit(self.p_ref)
        self._restart()

    def _restart(self) -> None:
        self.iteration = 0
        self._state = self._logit_ref.copy() if self._forward else self.p_ref.copy()
        if self._forward:  # the reference in force (it moves with sync_ref_model)
            self._current_ref = self._logit_ref.copy()

    def _moving_steps(self, todo: int) -> None:
        """``todo`` iterations of the moving-reference recurrence, syncs included."""
        reading = self.reading
        assert reading.ref_sync_every is not None
        for _ in range(todo):
            self._state = np.asarray(theory.pos_map_logit(
                self._state, self._current_ref, reading.beta,
                calibration=reading.calibration), dtype=float).reshape(self.p_ref.shape)
            self.iteration += 1
            if self.iteration % reading.ref_sync_every == 0:
                self._current_ref = mixed_reference_logit(self._state, self._current_ref,
                                                          reading.ref_mixup_alpha)

    @staticmethod
    def _probabilities(logits: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # as theory.iterate writes a path's probabilities
            return np.reciprocal(np.exp(np.negative(logits)) + 1.0)

    def path(self, n_iterations: int) -> np.ndarray:
        """``at(0), ..., at(n_iterations)`` as rows, shape ``(n + 1, n_prompts)``."""
        return np.stack([self.at(i) for i in range(int(n_iterations) + 1)])

    def at(self, n_iterations: int) -> np.ndarray:
        """Predicted PoS after ``n_iterations`` GRPO iterations, shape ``(n_prompts,)``."""
        n = int(n_iterations)
        if n < 0:
            raise ValueError(f"n_iterations must be >= 0, got {n_iterations!r}")
        reading = self.reading
        if not reading.predicts:
            return np.full(self.p_ref.size, np.nan)
        if reading.beta == 0:
            return self.p_ref.copy() if n == 0 else np.where(self.p_ref > 0, 1.0, 0.0)
        if n < self.iteration:
            self._restart()
        todo = n - self.iteration
        if reading.moving_reference:
            self._moving_steps(todo)
            self.steps += todo
            return self._probabilities(self._state)
        if self._forward:
            if todo:
                self._state = theory.iterate_logit(
                    self._state, self._logit_ref, reading.beta, todo, keep_path=False,
                    calibration=reading.calibration).reshape(self.p_ref.shape)
            self.steps += todo
            self.iteration = n
            with np.errstate(over="ignore"):  # as theory.iterate writes a path's probabilities
                return np.reciprocal(np.exp(np.negative(self._state)) + 1.0)
        for _ in range(todo):
            self._state = _reverse_step(self._state, self.p_ref, reading)
            self.steps += 1
        self.iteration = n
        return self._state.copy()


def predict_limits(p_ref: Any, reading: TheoryReading,
                   n_steps: int = 2000) -> tuple[np.ndarray, list[str]]:
    """Long-run PoS of the predicted iteration and its regime, per prompt.

    Regimes: ``"fixed_point"``, ``"saturates"`` (p -> 1), ``"absorbed"`` (p = 0),
    ``"cycle_2"`` and ``"irregular"`` (limit NaN: the iteration does not settle),
    ``"none"`` (no prediction).

    With a moving reference (``reading.moving_reference``) the reference's logit rises
    with the policy's at every sync (``Omega > 0``), so there is no interior fixed point:
    ``"saturates"`` where ``n_steps`` iterations bring p within 1e-6 of 1, ``"absorbed"``
    for ``p_ref = 0``, ``"none"`` (limit NaN) otherwise.
    """
    p_ref = np.atleast_1d(np.asarray(p_ref, dtype=np.float64))
    if not reading.predicts:
        return np.full(p_ref.size, np.nan), ["none"] * p_ref.size
    if reading.beta == 0:
        limits = np.where(p_ref > 0, 1.0, 0.0)
        return limits, ["saturates" if x > 0 else "absorbed" for x in p_ref]
    if reading.moving_reference:  # the reference follows the policy: no fixed point inside (0, 1)
        last = PredictedPath(p_ref, reading).at(n_steps)
        regimes = ["absorbed" if r == 0 else "saturates" if x > 1 - 1e-6 else "none"
                   for r, x in zip(p_ref, last, strict=True)]
        limits = np.where([r == "none" for r in regimes], np.nan, last)
        return limits, regimes
    if reading.kl_target == "forward":
        result = theory.classify_dynamics(p_ref, p_ref, reading.beta,
                                          calibration=reading.calibration,
                                          n_transient=n_steps // 2, n_measure=n_steps // 2)
        regimes = [theory.Regime(int(r)).name.lower() for r in np.atleast_1d(result.regime)]
        limits = np.atleast_2d(result.limits)[:, 0].copy()
        limits[[r in ("cycle_2", "irregular") for r in regimes]] = np.nan
        return limits, regimes
    # iterate the reverse-KL map until every prompt has settled (or n_steps have passed)
    tol = 1e-12
    earlier, before = np.full(p_ref.size, np.nan), p_ref
    last = _reverse_step(before, p_ref, reading)
    for _ in range(n_steps - 1):
        if np.all(np.abs(last - before) <= tol):
            break
        earlier, before, last = before, last, _reverse_step(last, p_ref, reading)
    regimes = []
    for i, p in enumerate(last):
        if abs(p - before[i]) <= tol:
            regimes.append("absorbed" if p == 0 else "saturates" if p == 1 else "fixed_point")
        elif abs(p - earlier[i]) <= tol:
            regimes.append("cycle_2")
        else:
            regimes.append("irregular")
    limits = np.where([r in ("cycle_2", "irregular") for r in regimes], np.nan, last)
    return limits, regimes
