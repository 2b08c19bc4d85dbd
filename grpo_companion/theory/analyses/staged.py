"""Staged GRPO: the reference policy is reset to the last iterate (App. C.2).

The "practical implications" paragraph of Appendix C.2 notes that GRPO is run
in stages, with ``pi_ref`` replaced by the last policy of the previous stage
(DeepSeekMath's iterative GRPO), and that Theorem 3 then amplifies the success
probability with respect to each new reference. In the recurrence of Table 1
this is: within a stage the map ``L_n = alpha L_ref^(s) + (1 - alpha) L_{n-1} +
Omega(p_{n-1}) / beta`` runs with the stage's reference logit ``L_ref^(s)``, and
after every ``stage_length`` steps ``L_ref^(s+1) = L_n``. The trainer's
``ref_reset_every`` does the same to the policies.

A moving reference (TRL's ``sync_ref_model=True`` with ``ref_model_sync_steps = k`` and
``ref_model_mixup_alpha = a``; its ``SyncRefModelCallback`` sets every parameter of the
reference to ``a theta + (1 - a) theta_ref`` after every ``k``-th optimiser step) is the
general case, :func:`moving_reference_iterate`; ``a = 1`` is the reset above.

Why a two-dimensional map is exact. For a tabular softmax policy the parameters are the
logits, so mixing parameters mixes log-probabilities up to normalisation:
``pi_ref'(o) = pi_n(o)^a pi_ref(o)^(1 - a) / Z``. Every policy met along the iteration
from ``pi_0 = pi_ref`` is *class-proportional* to ``pi_0``: ``pi(o) = pi_0(o) c_S`` on the
K outputs' successes and ``pi_0(o) c_F`` on their failures (Theorem 2's optimum
``pi_n(o) ~ pi_ref(o)^alpha pi_(n-1)(o)^(1 - alpha) exp(w(o) / beta)`` multiplies each
class by one factor, and so does the mix). Summing the mix over each class,
``p_ref' = p_n^a p_ref^(1 - a) / Z`` and ``1 - p_ref' = (1 - p_n)^a (1 - p_ref)^(1 - a) / Z``,
so the success logit of the mixed reference is exactly

    L_ref' = a L_n + (1 - a) L_ref

(:func:`mixed_reference_logit`), whatever the within-class profile of ``pi_0``; the
success *probability* is not the arithmetic mix ``a p_n + (1 - a) p_ref``. The formula
needs the within-class ratios ``pi_n(o) / pi_ref(o)`` to be equal (one per class), which
is what class-proportionality gives; for two arbitrary policies the mixed reference's
success probability is not a function of ``p_n`` and ``p_ref`` alone: Lemma 3 (App. E) adds
``(1 - a)(D_F - D_S)``, the order-``a`` Renyi divergences between the two policies' failure
and success conditionals, which vanish here
(:func:`grpo_companion.symbolic.two_kl.moving_reference` derives both;
``tests/theory/test_theory_staged.py`` checks both on K = 7 outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from grpo_companion.validation import (
    broadcast,
    check_alpha,
    check_beta,
    check_count,
    check_logit,
    check_memory,
    check_probability,
)

from ..calibration import Calibration, resolve_calibration
from ..dynamics import pos_map_logit
from ..logistic import logit, sigmoid

__all__ = ["StagedPath", "mixed_reference_logit", "moving_reference_iterate",
           "staged_iterate"]


@dataclass(frozen=True)
class StagedPath:
    """PoS path of staged GRPO (see :func:`staged_iterate`).

    Attributes
    ----------
    logit_p : logits ``L_0, ..., L_N``, shape ``(N + 1, *broadcast_shape)``.
    logit_p_ref : the reference logit in force for the step that produced each
        row (row 0: the initial reference), same shape.
    stage : the stage index of each step (row 0: stage 0).
    """

    logit_p: np.ndarray
    logit_p_ref: np.ndarray
    stage: np.ndarray

    @property
    def p(self) -> np.ndarray:
        """Success probabilities ``p_0, ..., p_N``."""
        return sigmoid(self.logit_p)

    @property
    def p_ref(self) -> np.ndarray:
        """The reference success probability in force at each step."""
        return sigmoid(self.logit_p_ref)


def staged_iterate(
    p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    stage_length: int,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> StagedPath:
    """PoS recurrence of GRPO with ``pi_ref`` reset every ``stage_length`` steps (App. C.2).

    Starts at ``p_0 = p_ref``. Step ``n`` applies the Table 1 map with the
    current reference; when ``n`` is a multiple of ``stage_length`` the reference
    becomes ``p_n`` (the trainer's ``ref_reset_every``). With ``stage_length = 1``
    and ``alpha = 1`` this is mirror GRPO (Theorem 4); with
    ``stage_length >= n_steps`` it is the plain recurrence.

    Parameters
    ----------
    p_ref : array_like
        Success probabilities of the first reference, in [0, 1].
    beta : array_like
        KL strength, > 0.
    n_steps, stage_length : int
        Number of GRPO steps (>= 0) and steps per stage (>= 1).
    alpha : array_like
        Reference share of the two-KL penalty, in [0, 1].
    calibration : Calibration, optional
        Or the :func:`~grpo_companion.theory.weights` keywords.
    """
    n_steps = check_count("n_steps", n_steps, 0)
    stage_length = check_count("stage_length", stage_length, 1)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr = logit(check_probability("p_ref", p_ref))
    b = check_beta(beta)
    a = check_alpha(alpha)
    lr, b, a = broadcast(p_ref=lr, beta=b, alpha=a)
    check_memory("n_steps", n_steps, 24.0 * (n_steps + 1) * lr.size, "the staged path")
    current = np.array(lr, dtype=float)
    ref = current.copy()
    logits, refs = [current.copy()], [ref.copy()]
    for n in range(1, int(n_steps) + 1):
        current = np.asarray(pos_map_logit(current, ref, b, alpha=a, calibration=cal), dtype=float)
        logits.append(current.copy())
        refs.append(ref.copy())
        if n % int(stage_length) == 0:
            ref = current.copy()
    stage = np.array([0] + [(n - 1) // int(stage_length) for n in range(1, int(n_steps) + 1)])
    return StagedPath(logit_p=np.stack(logits), logit_p_ref=np.stack(refs), stage=stage)


def mixed_reference_logit(
    logit_p: ArrayLike, logit_p_ref: ArrayLike, mixup_alpha: ArrayLike
) -> np.ndarray:
    """Success logit of the reference after one sync, ``a L_n + (1 - a) L_ref`` (App. C.2).

    TRL's ``SyncRefModelCallback`` (``sync_ref_model=True``) sets the reference's
    parameters to ``a theta + (1 - a) theta_ref`` with ``a = ref_model_mixup_alpha``. For a
    tabular softmax policy whose success logit is ``logit_p``, against a reference with
    success logit ``logit_p_ref`` and the same within-class profile (the class-proportional
    policies of the recurrence, see the module docstring), the mixed reference has success
    logit ``a logit_p + (1 - a) logit_p_ref`` exactly. ``a = 1`` returns ``logit_p`` and
    ``a = 0`` returns ``logit_p_ref`` bit for bit (infinite logits included).

    Parameters
    ----------
    logit_p, logit_p_ref : array_like
        Success logits of the policy and of the current reference (``+-inf`` allowed).
    mixup_alpha : array_like
        The policy's share ``a``, in [0, 1] (TRL's ``ref_model_mixup_alpha``).
    """
    lp = check_logit("logit_p", logit_p)
    lr = check_logit("logit_p_ref", logit_p_ref)
    a = check_alpha(mixup_alpha, "mixup_alpha")
    lp, lr, a = broadcast(logit_p=lp, logit_p_ref=lr, mixup_alpha=a)
    return _mix(lp, lr, a)


def _mix(lp: np.ndarray, lr: np.ndarray, a: np.ndarray) -> np.ndarray:
    # a L_n + (1 - a) L_ref; the ends exactly (0 * inf would be NaN)
    with np.errstate(invalid="ignore"):
        mixed = a * lp + (1.0 - a) * lr
    return np.where(a == 1.0, lp, np.where(a == 0.0, lr, mixed))


def moving_reference_iterate(
    p_ref: ArrayLike,
    beta: ArrayLike,
    n_steps: int,
    sync_steps: int,
    mixup_alpha: ArrayLike,
    *,
    alpha: ArrayLike = 1.0,
    calibration: Calibration | None = None,
    **calibration_kwargs: Any,
) -> StagedPath:
    """PoS recurrence of GRPO with a moving reference (TRL's ``sync_ref_model``; App. C.2).

    The two-dimensional map of ``(L_n, L_ref)``: step ``n`` applies Theorem 2's map (Table 1,
    :func:`~grpo_companion.theory.pos_map_logit`) with the current reference,
    ``L_n = alpha L_ref + (1 - alpha) L_(n-1) + Omega(p_(n-1)) / beta``, and when ``n`` is a
    multiple of ``sync_steps`` the reference is mixed toward the policy,
    ``L_ref <- a L_n + (1 - a) L_ref`` with ``a = mixup_alpha``
    (:func:`mixed_reference_logit`, exact for tabular policies). This is TRL's
    ``GRPOConfig(sync_ref_model=True, ref_model_sync_steps=k, ref_model_mixup_alpha=a)``
    when one of its iterations is one step here (``k`` counted in iterations), and the
    trainer's ``ref_reset_every=k`` with ``ref_mixup_alpha=a``.

    ``mixup_alpha = 1`` is staged GRPO (:func:`staged_iterate`, bit for bit) and
    ``mixup_alpha = 0`` the plain recurrence (:func:`~grpo_companion.theory.iterate_logit`).

    Parameters
    ----------
    p_ref : array_like
        Success probabilities of the first reference, in [0, 1]; ``p_0 = p_ref``.
    beta : array_like
        KL strength, > 0.
    n_steps, sync_steps : int
        Number of GRPO steps (>= 0) and steps between syncs (>= 1).
    mixup_alpha : array_like
        The policy's share of the mixed reference, in [0, 1].
    alpha : array_like
        Reference share of the two-KL penalty, in [0, 1].
    calibration : Calibration, optional
        Or the :func:`~grpo_companion.theory.weights` keywords.

    Returns
    -------
    StagedPath
        ``logit_p`` the path, ``logit_p_ref`` the reference in force for each step, and
        ``stage`` the number of syncs before each step.
    """
    n_steps = check_count("n_steps", n_steps, 0)
    sync_steps = check_count("sync_steps", sync_steps, 1)
    cal = resolve_calibration(calibration, **calibration_kwargs)
    lr = logit(check_probability("p_ref", p_ref))
    b = check_beta(beta)
    a = check_alpha(alpha)
    mix = check_alpha(mixup_alpha, "mixup_alpha")
    lr, b, a, mix = broadcast(p_ref=lr, beta=b, alpha=a, mixup_alpha=mix)
    check_memory("n_steps", n_steps, 24.0 * (n_steps + 1) * lr.size, "the moving-reference path")
    current = np.array(lr, dtype=float)
    ref = current.copy()
    logits, refs = [current.copy()], [ref.copy()]
    for n in range(1, n_steps + 1):
        current = np.asarray(pos_map_logit(current, ref, b, alpha=a, calibration=cal), dtype=float)
        logits.append(current.copy())
        refs.append(ref.copy())
        if n % sync_steps == 0:
            ref = _mix(current, ref, mix)
    stage = np.array([0] + [(n - 1) // sync_steps for n in range(1, n_steps + 1)])
    return StagedPath(logit_p=np.stack(logits), logit_p_ref=np.stack(refs), stage=stage)
