"""Logit and sigmoid, done so that probabilities within 1e-300 of 0 or 1 stay exact.

The dynamics of the paper are affine in the log-odds (Proposition 1, third
item), so the library works on logits ``L = log(p / (1 - p))`` and converts
back only at the end. ``1 - p`` is never formed by subtraction: it is
``sigmoid(-L)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy import special

from grpo_companion.validation import check_logit, check_probability

__all__ = ["log_bernoulli_variance", "log_sigmoid", "logit", "sigmoid"]


def logit(p: ArrayLike) -> np.ndarray:
    """Log-odds ``log(p / (1 - p))``; ``p = 0`` gives ``-inf`` and ``p = 1`` gives ``+inf``.

    Raises
    ------
    ValueError
        If ``p`` is outside [0, 1] or NaN.
    """
    return special.logit(check_probability("p", p))


def sigmoid(logit_p: ArrayLike) -> np.ndarray:
    """Logistic function ``1 / (1 + exp(-L))``; ``+-inf`` map to 1 and 0."""
    return special.expit(check_logit("logit_p", logit_p))



def log_sigmoid(logit_p: ArrayLike) -> np.ndarray:
    """``log(sigmoid(L))`` without underflow (``-softplus(-L)``)."""
    return _log_sigmoid(check_logit("logit_p", logit_p))


def _log_sigmoid(logit_p: np.ndarray) -> np.ndarray:
    return special.log_expit(logit_p)


def log_bernoulli_variance(logit_p: ArrayLike) -> np.ndarray:
    """``log(p (1 - p))`` for ``p = sigmoid(L)``: ``-|L| - 2 log(1 + exp(-|L|))``.

    Finite for every finite ``L``; ``-inf`` at ``L = +-inf``.
    """
    return _log_bernoulli_variance(check_logit("logit_p", logit_p))


def _log_bernoulli_variance(logit_p: np.ndarray) -> np.ndarray:
    """Unchecked kernel of :func:`log_bernoulli_variance` (inner loops call it)."""
    a = np.abs(np.asarray(logit_p, dtype=np.float64))
    return -a - 2.0 * np.log1p(np.exp(-a))
