"""Staged GRPO: the reference policy is reset to the last iterate (App. C.2).

The "practical implications" paragraph of Appendix C.2 notes that GRPO is run
in stages, with ``pi_ref`` replaced by the last policy of the previous stage
(DeepSeekMath's iterative GRPO), and that Theorem 3 then amplifies the success
probability with respect to each new reference. In the recurrence of Table 1
this is: within a stage the map ``L_n = alpha L_ref^(s) + (1 - alpha) L_{n-1} +
Omega(p_{n-1}) / beta`` runs with the stage's reference logit ``L_ref^(s)``, and
after every ``stage_length`` steps ``L_ref^(s+1) = L_n``. The trainer's
``ref_reset_every`` does the same to the policies.
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
    check_memory,
    check_probability,
)

from .calibration import Calibration, resolve_calibration
from .dynamics import pos_map_logit
from .logistic import logit, sigmoid

__all__ = ["StagedPath", "staged_iterate"]


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
