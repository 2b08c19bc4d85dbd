"""Reward normalisations: the advantage is ``(r - mean) / scale(variance)``.

A normalisation is described by two functions of the reward variance ``v``
(population or group estimate), each given ``v`` and, when ``eps = 0``,
also ``log v``:

``inverse``
    ``1 / scale(v)``. For the population calibration this *is* Omega(p)
    (paper, Proposition 1 and eq. 13), since ``w+ = (1 - p) / scale`` and
    ``w- = p / scale``.
``elasticity``
    ``v * d(1 / scale)/dv``, used for derivatives of Omega. Written this way it
    stays finite at ``v -> 0`` for every placement of ``eps``.

Using ``log v`` when ``eps = 0`` keeps the weights finite for variances below
the float64 range (``p`` within 1e-300 of 0 or 1, or given by its logit).
``log_inverse`` (``log(1 / scale)`` from ``log v``, used when ``eps = 0``) lets
the population weights ``w+ = (1 - p) / scale`` and ``w- = p / scale`` be
formed as ``exp(log(1 / scale) + log(1 - p))``: finite wherever the true
weight is, even where ``1 / scale`` itself exceeds the float64 range
(``|logit p| > 1419`` for the whitened scale).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["EPS_PLACEMENTS", "SCALES", "Scale"]

EPS_PLACEMENTS = ("sqrt", "std")


@dataclass(frozen=True)
class Scale:
    """The two functions that define a normalisation (see the module docstring)."""

    inverse: Callable[[np.ndarray, np.ndarray | None, float, str], np.ndarray]
    elasticity: Callable[[np.ndarray, np.ndarray | None, float, str], np.ndarray]
    log_inverse_without_eps: Callable[[np.ndarray], np.ndarray]
    unbounded_without_eps: bool


def _std_inverse(v: np.ndarray, log_v: np.ndarray | None, eps: float, placement: str) -> np.ndarray:
    if eps == 0:
        assert log_v is not None
        with np.errstate(over="ignore"):  # beyond |logit p| = 1419: larger than float64 holds
            return np.exp(-0.5 * log_v)
    if placement == "sqrt":  # paper, eq. (4): sqrt(v + eps)
        out = np.asarray(v + eps)
        np.sqrt(out, out=out)
    else:  # practice: sqrt(v) + eps
        out = np.asarray(np.sqrt(v))
        out += eps
    return np.reciprocal(out, out=out)


def _std_elasticity(
    v: np.ndarray, log_v: np.ndarray | None, eps: float, placement: str
) -> np.ndarray:
    inv = _std_inverse(v, log_v, eps, placement)
    if eps == 0:
        return -0.5 * inv
    if placement == "sqrt":
        return -0.5 * inv * (v / (v + eps))
    sd = np.sqrt(v)
    return -0.5 * inv * (sd / (sd + eps))


def _std_log_inverse(log_v: np.ndarray) -> np.ndarray:
    return -0.5 * log_v


def _log_ones(log_v: np.ndarray) -> np.ndarray:
    return np.zeros_like(log_v)


def _ones(v: np.ndarray, log_v: np.ndarray | None, eps: float, placement: str) -> np.ndarray:
    return np.ones_like(v)


def _zeros(v: np.ndarray, log_v: np.ndarray | None, eps: float, placement: str) -> np.ndarray:
    return np.zeros_like(v)


SCALES: dict[str, Scale] = {
    # GRPO / DeepSeekMath: whiten by the standard deviation.
    "mean_std": Scale(_std_inverse, _std_elasticity, _std_log_inverse,
                      unbounded_without_eps=True),
    # Dr. GRPO: subtract the mean only (paper, eq. 13).
    "mean_only": Scale(_ones, _zeros, _log_ones, unbounded_without_eps=False),
}
