"""Reward normalisations, each defined once: what a group gives a success and a failure.

With 0/1 rewards a per-group normalisation is fixed by two numbers for a group
of ``n`` samples with ``k`` successes (``0 < k < n``; a group whose rewards are
all equal gets advantage 0): the advantage ``+g+(k, n)`` of each success and
``-g-(k, n)`` of each failure. In the population limit (``n -> inf``,
``k / n -> p``) these become the paper's weights ``w+(p)``, ``w-(p)``
(eqs. 3, 4 and 13), and ``Omega = w+ + w-`` drives every PoS map.

Two words, kept apart throughout the package: a normalisation's **gains**
``g+(k, n)``, ``g-(k, n)`` are what one group gives a success and a failure (public
names ``gains``, ``gain_plus``, ``gain_minus``,
:func:`~grpo_companion.theory.finite_group.group_gains`);
the **weights** ``w+(p)``, ``w-(p)`` are their population limit, or their expectation
over the groups drawn at PoS ``p`` (``w_plus``, ``w_minus``,
:func:`~grpo_companion.theory.weights`,
:func:`~grpo_companion.theory.finite_group.group_weights_of_logit`).

A normalisation is registered as **one function**, its gains::

    def gains(succ, fail, n, cal, ops):
        ...
        return gain_plus, gain_minus

- ``succ``, ``fail``: the group's shares of successes and failures,
  ``k / n`` and ``(n - k) / n``; for the population, ``p`` and ``1 - p``
  (computed from the logit, so ``fail`` is exact near ``p = 1``);
- ``n``: the group size, or ``None`` for the population;
- ``cal``: the :class:`~grpo_companion.theory.Calibration`, for ``eps``,
  ``eps_placement`` and ``ddof``;
- ``ops``: ``sqrt`` and ``maximum`` of the caller's array library, so that the
  same function runs on numpy arrays, torch tensors and SymPy symbols.

From that one function the library derives the population weights, ``Omega``
and its derivative (by SymPy), the exact finite-group weights (a Bernstein sum
over ``k``), the numpy and torch group advantages, the SymPy expressions, and
so the trainer's sampled and exact modes. :func:`~grpo_companion.theory.register_normalization`
refuses a function whose advantage for a group depends on the other groups of
the batch (batch-level statistics are outside the per-prompt theory).

The built-in whitening and mean-only normalisations also carry hand-written
log-space kernels (:class:`LogKernels`) that keep the population weights exact
for ``p`` within 1e-300 of 0 or 1 and for ``eps = 0``; a test checks them
against their ``gains``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = [
    "EPS_PLACEMENTS",
    "NORMALIZATIONS",
    "NUMPY_OPS",
    "LogKernels",
    "Normalization",
    "Ops",
    "register_normalization",
    "sympy_ops",
    "unregister_normalization",
]

EPS_PLACEMENTS = ("sqrt", "std")


@dataclass(frozen=True)
class Ops:
    """The few array functions a ``gains`` function may use, for one array library."""

    sqrt: Callable[[Any], Any]
    maximum: Callable[[Any, Any], Any]


NUMPY_OPS = Ops(np.sqrt, np.maximum)


def sympy_ops() -> Ops:
    """``sqrt`` and ``maximum`` for SymPy expressions (imports SymPy on first use)."""
    import sympy as sp

    return Ops(sp.sqrt, sp.Max)


@dataclass(frozen=True)
class LogKernels:
    """Exact population kernels of a ``(r - mean) / scale(v)`` normalisation (optional).

    Each is a function of the reward variance ``v`` and, when ``eps = 0``, of
    ``log v``: ``inverse`` is ``1 / scale(v)`` (which is ``Omega``),
    ``elasticity`` is ``v d(1 / scale)/dv`` (finite at ``v -> 0``) and
    ``log_inverse_without_eps`` is ``log(1 / scale)`` from ``log v``.
    """

    inverse: Callable[[np.ndarray, np.ndarray | None, float, str], np.ndarray]
    elasticity: Callable[[np.ndarray, np.ndarray | None, float, str], np.ndarray]
    log_inverse_without_eps: Callable[[np.ndarray], np.ndarray]
    unbounded_without_eps: bool


@dataclass(frozen=True)
class Normalization:
    """One registered normalisation (see the module docstring).

    Attributes
    ----------
    name : str
    gains : callable
        ``gains(succ, fail, n, cal, ops) -> (gain_plus, gain_minus)``, the definition.
    summary : str
        One line for tables: what it does and where it comes from.
    uses_eps, uses_ddof : bool
        Whether ``Calibration.eps`` / ``eps_placement`` and ``ddof`` change it.
    kernels : LogKernels or None
        Optional exact log-space population kernels (built-ins only).
    """

    name: str
    gains: Callable[..., tuple[Any, Any]]
    summary: str
    uses_eps: bool = False
    uses_ddof: bool = False
    kernels: LogKernels | None = None


# --------------------------------------------------------------- the built-ins
def _whitened_gains(succ: Any, fail: Any, n: int | None, cal: Any, ops: Ops) -> tuple[Any, Any]:
    """GRPO: ``(r - mean) / std`` (paper, eqs. 1, 3 and 4; TRL with eps outside the sqrt)."""
    var = succ * fail if n is None else succ * fail * n / (n - cal.ddof)
    if cal.eps_placement == "sqrt":  # paper, eq. (4): sqrt(v + eps)
        scale = ops.sqrt(var + cal.eps)
    else:  # DeepSeekMath, TRL, verl: sqrt(v) + eps
        scale = ops.sqrt(var) + cal.eps
    return fail / scale, succ / scale


def _mean_only_gains(succ: Any, fail: Any, n: int | None, cal: Any, ops: Ops) -> tuple[Any, Any]:
    """Dr. GRPO: ``r - mean`` (paper, eq. 13)."""
    return fail, succ


def _rloo_gains(succ: Any, fail: Any, n: int | None, cal: Any, ops: Ops) -> tuple[Any, Any]:
    """RLOO: ``r_i`` minus the mean of the other ``n - 1`` rewards of the group.

    A success's baseline is ``(k - 1) / (n - 1)``, a failure's ``k / (n - 1)``,
    so the gains are ``n / (n - 1)`` times mean-only's; the population limit is
    mean-only itself.
    """
    factor = 1 if n is None else n / (n - 1)
    return fail * factor, succ * factor


def _max_abs_gains(succ: Any, fail: Any, n: int | None, cal: Any, ops: Ops) -> tuple[Any, Any]:
    """``(r - mean) / max_i |r_i - mean|``: centred, and at most 1 in magnitude.

    The larger of the two centred values is ``max(succ, fail)``, so ``w+ =
    (1 - p) / max(p, 1 - p)`` and ``w- = p / max(p, 1 - p)``; ``Omega = 1 /
    max(p, 1 - p)`` lies in [1, 2] and needs no smoothing.
    """
    top = ops.maximum(succ, fail)
    return fail / top, succ / top


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


#: Every registered normalisation, by name. Validators read this dict when they run,
#: so a normalisation registered later (for example in a notebook) is accepted everywhere.
NORMALIZATIONS: dict[str, Normalization] = {}


def _check_per_group(name: str, gains: Callable[..., tuple[Any, Any]]) -> None:
    """Refuse a ``gains`` that is not a function of one group's ``(k, n)``."""
    cal = SimpleNamespace(normalization=name, eps=1e-4, eps_placement="std", group_size=None,
                          ddof=1)
    for n in (2, 3, 8):
        k = np.arange(1, n, dtype=np.float64)
        try:
            plus, minus = (np.asarray(x, dtype=np.float64) * np.ones_like(k)
                           for x in gains(k / n, (n - k) / n, n, cal, NUMPY_OPS))
            alone = [tuple(float(np.asarray(x)) for x in gains(
                np.float64(kk / n), np.float64((n - kk) / n), n, cal, NUMPY_OPS)) for kk in k]
            pop = [np.asarray(x, dtype=np.float64) for x in gains(
                np.array([0.3, 0.7]), np.array([0.7, 0.3]), None, cal, NUMPY_OPS)]
        except Exception as err:  # noqa: BLE001 - report any failure as a bad registration
            raise ValueError(
                f"normalisation {name!r}: gains(succ, fail, n, cal, ops) failed on numpy arrays "
                f"({type(err).__name__}: {err}); it must return (gain_plus, gain_minus) for "
                "arrays of "
                "group shares, for a group size n and for n=None (the population)") from err
        together = np.stack([plus, minus], axis=1)
        if not np.all(np.isfinite(together)) or not all(np.all(np.isfinite(x)) for x in pop):
            raise ValueError(f"normalisation {name!r}: gains must be finite for 0 < k < n and "
                             f"for the population at p in (0, 1); got {together.tolist()} for "
                             f"n={n}")
        if np.any(together < 0) or any(np.any(x < 0) for x in pop):
            raise ValueError(f"normalisation {name!r}: gains are magnitudes (a success gets "
                             f"+gain_plus, a failure -gain_minus) and must be >= 0; got "
                             f"{together.tolist()}")
        if not np.array_equal(together, np.array(alone)):
            raise ValueError(
                f"normalisation {name!r}: the advantage of a group depends on the other groups "
                "it is computed with (for example a batch-level mean or std); only per-group "
                "normalisations, functions of one group's (k, n), fit the per-prompt theory. "
                "Model the batch effect outside the registry instead")


def _check_symbolic(name: str, gains: Callable[..., tuple[Any, Any]]) -> None:
    """Refuse a ``gains`` that does not run on SymPy symbols (for example ``np.sqrt``).

    The SymPy expressions, ``Omega'`` of a normalisation without kernels and the
    torch advantages all call ``gains`` with another array library's ``ops``; a
    function that calls numpy itself only works on numpy arrays.
    """
    import sympy as sp

    p, q = sp.symbols("p q", positive=True)
    k = sp.Symbol("k", positive=True)
    ops = sympy_ops()
    for placement in EPS_PLACEMENTS:
        for eps in (sp.Symbol("eps", positive=True), sp.Integer(0)):
            spec = SimpleNamespace(normalization=name, eps=eps, eps_placement=placement,
                                   group_size=None, ddof=1)
            for succ, fail, n in ((p, q, None), (k / 8, (8 - k) / 8, 8)):
                try:
                    plus, minus = gains(succ, fail, n, spec, ops)
                    sp.sympify(plus, strict=True)
                    sp.sympify(minus, strict=True)
                except Exception as err:  # noqa: BLE001 - any failure is a bad registration
                    raise ValueError(
                        f"normalisation {name!r}: gains(succ, fail, n, cal, ops) failed on SymPy "
                        f"symbols ({type(err).__name__}: {err}); the one function must run on "
                        "numpy arrays, torch tensors and SymPy expressions alike: use ops.sqrt "
                        "and ops.maximum (not np.sqrt, np.maximum, math.sqrt, ...) and plain "
                        "arithmetic") from err


def register_normalization(
    name: str,
    gains: Callable[..., tuple[Any, Any]],
    *,
    summary: str,
    uses_eps: bool = False,
    uses_ddof: bool = False,
    kernels: LogKernels | None = None,
    replace: bool = False,
) -> Normalization:
    """Register a normalisation under ``name``: the one edit that adds a calibration.

    Parameters
    ----------
    name : str
        The value of ``Calibration(normalization=...)`` that selects it.
    gains : callable
        ``gains(succ, fail, n, cal, ops) -> (gain_plus, gain_minus)``; see the module docstring.
    summary : str
        One line for tables.
    uses_eps, uses_ddof : bool
        Whether the calibration's ``eps`` and ``ddof`` enter ``gains``.
    kernels : LogKernels, optional
        Exact log-space population kernels; without them the population
        weights are ``gains`` on ``p`` and ``1 - p`` and ``Omega'`` is derived by SymPy.
    replace : bool
        Allow replacing an existing registration (never a built-in).

    Raises
    ------
    ValueError
        If the name is taken, or ``gains`` fails on numpy arrays or on SymPy
        symbols (it must use ``ops.sqrt`` / ``ops.maximum``, not numpy's), is
        not finite and non-negative for the sizes tried, or is not a function of
        one group's ``(k, n)``. Every other group size is checked when its
        advantage table is built (:func:`~grpo_companion.theory.finite_group.group_table`),
        so a gain that is negative or not finite only for, say, ``G = 16``
        raises there, naming the group size and ``k``.

    Notes
    -----
    A :class:`~grpo_companion.theory.Calibration` keeps the registration it was
    built with: replacing a registration changes calibrations built afterwards.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name must be a Python identifier, got {name!r}")
    if name in _BUILT_INS or (name in NORMALIZATIONS and not replace):
        raise ValueError(f"a normalisation named {name!r} is already registered; pick another "
                         "name" + ("" if name in _BUILT_INS else " or pass replace=True"))
    if not callable(gains):
        raise ValueError(f"gains must be callable, got {gains!r}")
    _check_per_group(name, gains)
    _check_symbolic(name, gains)
    entry = Normalization(name, gains, str(summary), bool(uses_eps), bool(uses_ddof), kernels)
    NORMALIZATIONS[name] = entry
    return entry


def unregister_normalization(name: str) -> None:
    """Remove a normalisation added by :func:`register_normalization` (not a built-in)."""
    if name in _BUILT_INS:
        raise ValueError(f"{name!r} is built in and cannot be removed")
    if name not in NORMALIZATIONS:
        raise ValueError(f"no normalisation named {name!r} is registered")
    del NORMALIZATIONS[name]


_BUILT_INS: tuple[str, ...] = ()
for _entry in (
    Normalization("mean_std", _whitened_gains,
                  "GRPO: (r - mean) / std (paper eqs. 3-4; TRL scale_rewards='group')",
                  uses_eps=True, uses_ddof=True,
                  kernels=LogKernels(_std_inverse, _std_elasticity, _std_log_inverse,
                                     unbounded_without_eps=True)),
    Normalization("mean_only", _mean_only_gains,
                  "Dr. GRPO: r - mean (paper eq. 13; TRL scale_rewards='none')",
                  kernels=LogKernels(_ones, _zeros, _log_ones, unbounded_without_eps=False)),
    Normalization("rloo", _rloo_gains,
                  "RLOO: r minus the mean of the other n - 1 rewards (population: mean-only)"),
    Normalization("max_abs", _max_abs_gains,
                  "(r - mean) / max |r - mean|: bounded by 1, no smoothing needed"),
):
    NORMALIZATIONS[_entry.name] = _entry
_BUILT_INS = tuple(NORMALIZATIONS)
del _entry
