"""Input checks shared by the theory modules.

Every check raises :class:`ValueError` that names the parameter, the offending
value and the valid range. Nothing is clipped into range.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "as_float_array",
    "check_alpha",
    "check_beta",
    "check_logit",
    "check_probability",
    "check_probability_vector",
    "check_success_mask",
]


def _first_bad(x: np.ndarray, bad: np.ndarray) -> float:
    return float(x[bad].flat[0]) if x.ndim else float(x)


def as_float_array(name: str, value: object) -> np.ndarray:
    """Convert ``value`` to a float64 array; reject NaN."""
    try:
        x = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric, got {value!r}") from err
    if np.isnan(x).any():
        raise ValueError(f"{name} must not contain NaN, got {value!r}")
    return x


def check_probability(name: str, value: object, *, open_interval: bool = False) -> np.ndarray:
    """Return ``value`` as an array after checking it lies in [0, 1] (or (0, 1))."""
    x = as_float_array(name, value)
    bad = (x <= 0) | (x >= 1) if open_interval else (x < 0) | (x > 1)
    if bad.any():
        rng = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{name} must be in {rng}, got {_first_bad(x, bad)!r}")
    return x


def check_logit(name: str, value: object) -> np.ndarray:
    """Return a logit array; +-inf (probabilities 1 and 0) are allowed, NaN is not."""
    return as_float_array(name, value)


def check_beta(value: object) -> np.ndarray:
    """``beta`` must be a finite number > 0."""
    x = as_float_array("beta", value)
    bad = ~(x > 0) | ~np.isfinite(x)
    if bad.any():
        raise ValueError(f"beta must be > 0 and finite, got {_first_bad(x, bad)!r}")
    return x


def check_alpha(value: object) -> np.ndarray:
    """``alpha`` (reference share of the two-KL penalty) must be in [0, 1]."""
    x = as_float_array("alpha", value)
    bad = (x < 0) | (x > 1)
    if bad.any():
        raise ValueError(f"alpha must be in [0, 1], got {_first_bad(x, bad)!r}")
    return x


def check_probability_vector(name: str, value: object, *, atol: float = 1e-9) -> np.ndarray:
    """Check a (batch of) probability vector(s) over the last axis."""
    x = as_float_array(name, value)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis of outcomes, got {value!r}")
    if (x < 0).any() or not np.isfinite(x).all():
        bad = (x < 0) | ~np.isfinite(x)
        raise ValueError(
            f"{name} must have finite non-negative entries, got {_first_bad(x, bad)!r}"
        )
    total = x.sum(axis=-1)
    off = np.abs(total - 1.0) > atol * max(1, x.shape[-1])
    if off.any():
        raise ValueError(
            f"{name} must sum to 1 over its last axis, got a sum of {_first_bad(total, off)!r}"
        )
    return x


def check_success_mask(value: object) -> np.ndarray:
    """``success_mask`` must hold only 0/1 (or booleans); returned as a bool array."""
    x = np.asarray(value)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"success_mask must have a non-empty last axis, got {value!r}")
    if x.dtype == bool:
        return x
    try:
        xf = x.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"success_mask must be binary (0/1), got {value!r}") from err
    bad = (xf != 0) & (xf != 1)
    if bad.any():
        raise ValueError(
            f"success_mask must be binary (0/1 or bool), got {_first_bad(xf, bad)!r}"
        )
    return xf == 1
