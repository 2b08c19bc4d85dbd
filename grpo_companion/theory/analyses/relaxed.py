"""Relaxed GRPO steps: training iterations that take a fraction of the exact step.

The paper's recurrences describe iterations whose inner problem is solved
exactly. A trainer that takes a few optimiser steps per iteration stops short.
A simple model of that is a proximal step: the inner objective carries an extra
penalty ``gamma KL(pi || pi_{n-1})``. With ``lambda = beta / (beta + gamma)``
(the *step fraction*, in ``(0, 1]``) the log-odds then move a fraction
``lambda`` of the way to the exact step::

    L_n = (1 - lambda) L_{n-1} + lambda [alpha L_ref + (1 - alpha) L_{n-1} + Omega(p_{n-1}) / beta]

which is the two-KL recurrence (Theorem 9 along reward-class tilts of
``pi_ref``) with reference share ``lambda * alpha`` and KL weight
``beta / lambda``. The fixed points do not depend on ``lambda``; only the speed
and the stability do. ``lambda = 1`` is the paper's recurrence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from grpo_companion.validation import check_interval, check_probability, check_real

from ..calibration import resolve_calibration
from ..dynamics import iterate

__all__ = ["fit_step_fraction", "relaxed_iterate"]


def _check_fraction(step_fraction: float, name: str = "step_fraction") -> float:
    return float(check_real(name, step_fraction, 0.0, 1.0, open_low=True, scalar=True))


def relaxed_iterate(
    p0: ArrayLike,
    p_ref: ArrayLike,
    beta: float,
    n_steps: int,
    step_fraction: float,
    *,
    alpha: float = 1.0,
    **calibration: Any,
) -> np.ndarray:
    """PoS after ``0..n_steps`` relaxed steps (see the module docstring).

    Equals :func:`~grpo_companion.theory.iterate` with ``beta / step_fraction``
    and ``alpha * step_fraction``; shape ``(n_steps + 1, ...)``.
    """
    lam = _check_fraction(step_fraction)
    b = float(check_real("beta", beta, 0.0, open_low=True, scalar=True))
    a = float(check_real("alpha", alpha, 0.0, 1.0, scalar=True))
    return iterate(p0, p_ref, b / lam, n_steps, alpha=lam * a, **calibration)


def fit_step_fraction(
    success_prob: ArrayLike,
    beta: float,
    *,
    alpha: float = 1.0,
    bounds: tuple[float, float] = (1e-4, 1.0),
    **calibration: Any,
) -> float:
    """Least-squares step fraction for observed success trajectories.

    Parameters
    ----------
    success_prob : array, shape (iterations + 1, prompts)
        Measured success probabilities; row 0 is each prompt's ``p_ref``, which
        is also where its predicted trajectory starts.
    beta, alpha, calibration : as in :func:`relaxed_iterate`.
    bounds : the search interval for the fraction, searched on a log scale.

    Returns
    -------
    float
        The fraction minimising the mean squared difference between the
        measured and the predicted trajectories.
    """
    observed = check_probability("success_prob", success_prob)
    if observed.ndim != 2 or observed.shape[0] < 2:
        raise ValueError(
            f"success_prob must have shape (iterations + 1, prompts) with at least one "
            f"iteration, got shape {observed.shape}"
        )
    beta = float(check_real("beta", beta, 0.0, open_low=True, scalar=True))
    alpha = float(check_real("alpha", alpha, 0.0, 1.0, scalar=True))
    low, high = check_interval("bounds", bounds, 0.0, 1.0, open_low=True)
    resolve_calibration(**calibration)  # refuse bad keywords before the search
    n_steps = observed.shape[0] - 1

    def loss(log_fraction: float) -> float:
        predicted = relaxed_iterate(observed[0], observed[0], beta, n_steps,
                                    float(np.exp(log_fraction)), alpha=alpha, **calibration)
        return float(np.mean((predicted - observed) ** 2))

    best = optimize.minimize_scalar(loss, bounds=(np.log(low), np.log(high)), method="bounded",
                                    options={"xatol": 1e-3})
    return float(np.exp(best.x))
