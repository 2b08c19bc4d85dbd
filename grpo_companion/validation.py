"""Input checks shared by the library: theory, the explorer and the trainer.

Every check raises :class:`ValueError` that names the parameter, the offending
value and the valid range. Nothing is clipped into range and nothing is
converted silently: ``None``, strings, booleans, complex numbers and objects
are refused where a number is expected, and a float is refused where an
integer count is expected. Arrays may be empty (an empty batch gives an empty
result); arrays of parameters that are combined elementwise must broadcast
together (:func:`broadcast`), and counts that size an allocation are checked
against this machine's memory before anything is allocated
(:func:`check_memory`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from grpo_companion.host import memory_limit_bytes

__all__ = [
    "as_float_array",
    "broadcast",
    "check_alpha",
    "check_beta",
    "check_choice",
    "check_count",
    "check_flag",
    "check_interval",
    "check_logit",
    "check_memory",
    "check_number",
    "check_probability",
    "check_probability_vector",
    "check_real",
    "check_scalar_array",
    "check_seed",
    "check_success_mask",
    "is_real_number",
    "memory_limit_bytes",
]

#: The largest seed accepted: numpy and torch generators take 64-bit seeds.
MAX_SEED = 2**64 - 1


def _show(value: object) -> str:
    """A short ``repr`` for messages (numpy summarises long arrays itself)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _first_bad(x: np.ndarray, bad: np.ndarray) -> float:
    return float(x[bad].flat[0]) if x.ndim else float(x)


def _where(x: np.ndarray, bad: np.ndarray) -> str:
    if x.ndim == 0:
        return ""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return f" at index {index}"


def as_float_array(name: str, value: object, valid: str = "a real number") -> np.ndarray:
    """Convert ``value`` to a float64 array; refuse NaN and anything that is not a real number.

    ``valid`` says what the valid values are, as a predicate for the message
    (``"in [0, 1]"``, ``"> 0 and finite"``). Booleans, ``None``, strings,
    complex and object values are refused rather than converted.
    """
    what = f"a real number or an array of real numbers ({valid})"
    if value is None or isinstance(value, str | bytes | bool | np.bool_):
        raise ValueError(f"{name} must be {what}, got {_show(value)}")
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as err:  # ragged nested sequences
        raise ValueError(f"{name} must be {what}, got {_show(value)}") from err
    if raw.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be {what}, got {_show(value)} (dtype {raw.dtype})")
    x = raw.astype(np.float64, copy=False)
    nan = np.isnan(x)
    if nan.any():
        raise ValueError(f"{name} must be {valid}, got NaN{_where(x, nan)} in {_show(value)}")
    return x


def check_scalar_array(name: str, x: np.ndarray) -> np.ndarray:
    """Refuse arrays with more than one element where a single number is expected."""
    if x.size != 1:
        raise ValueError(f"{name} must be a single number, got an array of shape {x.shape}")
    return x.reshape(())


def _check_range(name: str, x: np.ndarray, bad: np.ndarray, valid: str) -> np.ndarray:
    if bad.any():
        raise ValueError(f"{name} must be {valid}, got {_first_bad(x, bad)!r}{_where(x, bad)}")
    return x


def check_probability(name: str, value: object, *, open_interval: bool = False) -> np.ndarray:
    """Return ``value`` as an array after checking it lies in [0, 1] (or (0, 1))."""
    valid = "in (0, 1)" if open_interval else "in [0, 1]"
    x = as_float_array(name, value, valid)
    bad = (x <= 0) | (x >= 1) if open_interval else (x < 0) | (x > 1)
    return _check_range(name, x, bad, valid)


def check_logit(name: str, value: object) -> np.ndarray:
    """Return a logit array; +-inf (probabilities 1 and 0) are allowed, NaN is not."""
    return as_float_array(name, value, "a logit: a real number or +-inf")


def check_real(
    name: str,
    value: object,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
    finite: bool = True,
    scalar: bool = False,
) -> np.ndarray:
    """A real number (or array) in the interval from ``low`` to ``high``.

    ``finite`` refuses ``+-inf`` even when the interval is unbounded;
    ``scalar`` refuses arrays with more than one element (the result is 0-d).
    """
    lo = "(" if open_low else "["
    hi = ")" if open_high or math.isinf(high) else "]"
    if math.isinf(low) and math.isinf(high):
        valid = "a finite real number" if finite else "a real number"
    elif math.isinf(high):
        valid = f"{'>' if open_low else '>='} {low:g}" + (" and finite" if finite else "")
    else:
        valid = f"in {lo}{low:g}, {high:g}{hi}"
    x = as_float_array(name, value, valid)
    if scalar:
        x = check_scalar_array(name, x)
    bad = (x <= low) if open_low else (x < low)
    bad = bad | ((x >= high) if open_high else (x > high))
    if finite:
        bad = bad | ~np.isfinite(x)
    return _check_range(name, x, bad, valid)


def is_real_number(
    value: object, low: float = -math.inf, high: float = math.inf, *, open_low: bool = False
) -> bool:
    """Whether ``value`` is one Python number (``int`` or ``float``, not ``bool``, not NaN) in
    ``[low, high]`` (``(low, high]`` with ``open_low``).

    The scalar counterpart of :func:`check_real`, for settings that are plain numbers (the
    trainer's loss arguments and configuration fields): arrays, strings and numpy scalars other
    than ``numpy.float64`` (a ``float``) are not numbers here.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return False
    return (value > low if open_low else value >= low) and value <= high


def check_number(name: str, value: object, low: float, high: float) -> None:
    """Refuse ``value`` unless :func:`is_real_number` in ``[low, high]``.

    Raises
    ------
    ValueError
        ``"<name> must be a number in [<low>, <high>], got <value!r>"``.
    """
    if not is_real_number(value, low, high):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")


def check_interval(
    name: str,
    value: object,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    open_low: bool = False,
) -> tuple[float, float]:
    """A pair ``(lo, hi)`` of finite numbers with ``lo < hi``, both in the given range."""
    valid = "a pair (lo, hi) of finite numbers with lo < hi"
    if not (math.isinf(low) and math.isinf(high)):
        valid += f", both in {'(' if open_low else '['}{low:g}, {high:g}]"
    try:
        if value is None or isinstance(value, str | bytes):
            raise TypeError
        items = tuple(value)  # type: ignore[call-overload]
        if len(items) != 2:
            raise TypeError
        lo, hi = (float(check_real(name, v, low, high, open_low=open_low, scalar=True))
                  for v in items)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be {valid}, got {_show(value)}") from err
    if not lo < hi:
        raise ValueError(f"{name} must be {valid}, got {_show(value)}")
    return lo, hi


def check_beta(value: object, name: str = "beta") -> np.ndarray:
    """``beta`` must be a finite number > 0."""
    return check_real(name, value, 0.0, open_low=True)


def check_alpha(value: object, name: str = "alpha") -> np.ndarray:
    """``alpha`` (reference share of the two-KL penalty) must be in [0, 1]."""
    return check_real(name, value, 0.0, 1.0)


def check_count(
    name: str, value: object, minimum: int = 0, maximum: int | None = None
) -> int:
    """An integer (Python or numpy, not bool, not float) in ``[minimum, maximum]``."""
    valid = f"an integer >= {minimum}" if maximum is None else (
        f"an integer in [{minimum}, {maximum}]")
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be {valid}, got {_show(value)}")
    n = int(value)
    if n < minimum or (maximum is not None and n > maximum):
        raise ValueError(f"{name} must be {valid}, got {n!r}")
    return n


def check_flag(name: str, value: object) -> bool:
    """``True`` or ``False`` (numpy booleans too), nothing that merely converts to one."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {_show(value)}")
    return bool(value)


def check_choice(name: str, value: object, choices: Sequence[object]) -> object:
    """One of ``choices``, of the same type (so ``True`` is not ``1`` and ``0.0`` not ``0``)."""
    for choice in choices:
        same_kind = isinstance(value, type(choice)) and (
            isinstance(value, bool) == isinstance(choice, bool))
        if same_kind and value == choice:
            return value
    raise ValueError(f"{name} must be one of {tuple(choices)!r}, got {_show(value)}")


def check_seed(name: str, value: object, *, allow_none: bool = False) -> object:
    """A seed: an integer in ``[0, 2**64 - 1]`` or a :class:`numpy.random.Generator`."""
    if isinstance(value, np.random.Generator) or (allow_none and value is None):
        return value
    valid = "an integer in [0, 2**64 - 1] or a numpy Generator"
    if allow_none:
        valid += " or None"
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral) or not (
        0 <= int(value) <= MAX_SEED
    ):
        raise ValueError(f"{name} must be {valid}, got {_show(value)}")
    return int(value)


def broadcast(**arrays: np.ndarray) -> list[np.ndarray]:
    """``np.broadcast_arrays`` of the named arrays; a clear error naming them if impossible."""
    try:
        return list(np.broadcast_arrays(*arrays.values()))
    except ValueError as err:
        shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise ValueError(
            f"{', '.join(arrays)} must have shapes that broadcast together, got {shapes}"
        ) from err


def broadcast_shapes(**shapes: tuple[int, ...]) -> tuple[int, ...]:
    """``np.broadcast_shapes`` with the error of :func:`broadcast`."""
    try:
        return tuple(np.broadcast_shapes(*shapes.values()))
    except ValueError as err:
        text = ", ".join(f"{k} {v}" for k, v in shapes.items())
        raise ValueError(
            f"{', '.join(shapes)} must have shapes that broadcast together, got {text}"
        ) from err


def check_memory(name: str, value: object, n_bytes: float, what: str = "its arrays") -> None:
    """Refuse a request whose arrays would need more than this machine's memory.

    ``n_bytes`` is the caller's estimate of the largest allocation the request
    makes; the message reports it so that the user can size the call.
    """
    limit = memory_limit_bytes()
    if n_bytes > limit:
        shown = value if isinstance(value, str) else _show(value)
        raise ValueError(
            f"{name}={shown} needs about {n_bytes / 2**30:.3g} GiB for {what}, more than "
            f"this machine's {limit / 2**30:.3g} GiB of memory; choose a smaller {name}"
        )


def check_probability_vector(name: str, value: object, *, atol: float = 1e-9) -> np.ndarray:
    """Check a (batch of) probability vector(s) over the last axis.

    Leading (batch) axes may be empty; the last axis of outcomes may not.
    """
    x = as_float_array(name, value, "probability vectors: non-negative, summing to 1")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis of outcomes, "
                         f"got {_show(value)}")
    bad = (x < 0) | ~np.isfinite(x)
    if bad.any():
        raise ValueError(
            f"{name} must have finite non-negative entries, got {_first_bad(x, bad)!r}"
            f"{_where(x, bad)}"
        )
    total = x.sum(axis=-1)
    off = np.abs(total - 1.0) > atol * max(1, x.shape[-1])
    if off.any():
        raise ValueError(
            f"{name} must sum to 1 over its last axis, got a sum of {_first_bad(total, off)!r}"
        )
    return x


def check_success_mask(value: object, name: str = "success_mask") -> np.ndarray:
    """``success_mask`` must hold only 0/1 (or booleans); returned as a bool array."""
    if value is None or isinstance(value, str | bytes):
        raise ValueError(f"{name} must be an array of 0/1 or booleans, got {_show(value)}")
    try:
        x = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be an array of 0/1 or booleans, "
                         f"got {_show(value)}") from err
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last axis, got {_show(value)}")
    if x.dtype == bool:
        return x
    if x.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be binary (0/1 or bool), got {_show(value)} "
                         f"(dtype {x.dtype})")
    xf = x.astype(np.float64)
    bad = (xf != 0) & (xf != 1)
    if bad.any():
        raise ValueError(
            f"{name} must be binary (0/1 or bool), got {_first_bad(xf, bad)!r}{_where(xf, bad)}"
        )
    return xf == 1
