"""Reward calibrations: the weights w+(p), w-(p) and Omega(p) = w+ + w-.

A GRPO variant's advantage for a binary reward is ``+w+(p)`` on a success and
``-w-(p)`` on a failure, where ``p`` is the success probability of the policy
that sampled the group (paper, eqs. 3, 4 and 13). All PoS dynamics depend on
the calibration only through ``Omega = w+ + w-``.
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize
from scipy.special import expit

from grpo_companion.validation import (
    check_choice,
    check_count,
    check_logit,
    check_memory,
    check_probability,
    check_real,
)

from ._group_kernels import (
    _group_gains,
    _group_weights_of_logit,
    _group_weights_prime_of_logit,
)
from .logistic import _log_bernoulli_variance, _log_sigmoid, logit
from .normalizations import EPS_PLACEMENTS, NORMALIZATIONS, NUMPY_OPS, Normalization

__all__ = [
    "EPS_PLACEMENTS",
    "NORMALIZATIONS",
    "Calibration",
    "omega",
    "omega_of_logit",
    "resolve_calibration",
    "weights",
]



@dataclass(frozen=True)
class Calibration:
    """One GRPO reward calibration; the project's single definition of each variant.

    Parameters
    ----------
    normalization : str
        A name registered in ``grpo_companion.theory.NORMALIZATIONS``:
        ``"mean_std"`` whitens ``(r - mean) / std`` (GRPO, paper eq. 4);
        ``"mean_only"`` only centres ``r - mean`` (Dr. GRPO, paper eq. 13);
        ``"rloo"`` subtracts the mean of the other rewards of the group;
        ``"max_abs"`` divides the centred reward by its largest magnitude.
    eps : float
        Smoothing: 0 or at least 1e-300 (subnormal values would overflow
        ``1 / eps``). Only ``"mean_std"`` uses it. With ``eps = 0`` the population
        ``"mean_std"`` weights are undefined at ``p`` in {0, 1}.
    eps_placement : {"sqrt", "std"}
        ``"sqrt"``: ``sqrt(p (1 - p) + eps)`` as in the paper, eq. (4).
        ``"std"``: ``sqrt(p (1 - p)) + eps`` as in DeepSeekMath, TRL and verl.
    group_size : int or None
        ``None`` uses the population mean and variance (the paper). An integer
        ``G >= 2`` gives the exact expected weights when mean and standard
        deviation are estimated from a group of ``G`` samples
        (:mod:`grpo_companion.theory.finite_group`).
    ddof : {0, 1}
        Group standard deviation with ``1 / G`` (0) or Bessel's ``1 / (G - 1)``
        (1, as ``torch.std`` and TRL). Only used when ``group_size`` is set.
    definition : Normalization, optional
        The registered normalisation to use; by default the one registered
        under ``normalization`` now. It is bound: a calibration keeps the
        function it was built with when the name is registered again
        (``register_normalization(..., replace=True)``), and so do
        ``dataclasses.replace`` (for example ``replace(cal, group_size=G)``),
        copies and pickles of it. A ``definition`` of another name is ignored
        (so ``replace(cal, normalization=...)`` picks that name's
        registration). Not a dataclass field: ``fields``, ``asdict`` and the
        repr show the five parameters above, while equality and hashing also
        compare the bound definition.

    Notes
    -----
    **Adding a variant.** Register one function, what a group of ``n`` with
    ``k`` successes gives a success and a failure, with
    :func:`~grpo_companion.theory.register_normalization`. It
    gives the population weights, Omega and its derivative, the finite-group
    weights, the numpy and torch group advantages and the SymPy expressions,
    hence the policies, PoS maps, fixed points and both training modes. The
    chapter "Add your own variant" does it in a notebook.
    """

    normalization: str = "mean_std"
    eps: float = 1e-5
    eps_placement: str = "sqrt"
    group_size: int | None = None
    ddof: int = 0
    definition: InitVar[Normalization | None] = None

    def __post_init__(self, definition: Normalization | None) -> None:
        if definition is not None and not isinstance(definition, Normalization):
            raise ValueError("definition must be a registered Normalization (an entry of "
                             f"NORMALIZATIONS) or None, got {definition!r}")
        if definition is None or definition.name != self.normalization:
            check_choice("normalization", self.normalization, tuple(NORMALIZATIONS))
            definition = NORMALIZATIONS[self.normalization]
        # bound here, once: the registry may change later (replace=True, unregister)
        object.__setattr__(self, "definition", definition)
        check_choice("eps_placement", self.eps_placement, EPS_PLACEMENTS)
        eps = float(check_real("eps", self.eps, 0.0, scalar=True))
        if not (eps == 0 or eps >= 1e-300):
            raise ValueError(f"eps must be 0 or a finite number >= 1e-300, got {self.eps!r}")
        object.__setattr__(self, "eps", eps)
        object.__setattr__(self, "ddof", check_count("ddof", self.ddof, 0, 1))
        if self.group_size is not None:
            g = check_count("group_size", self.group_size, 2)
            # the gains, and the binomial weights of one cell, hold a few arrays of G values
            check_memory("group_size", g, 64.0 * (g + 1), "the finite-group weights")
            object.__setattr__(self, "group_size", g)

    # ------------------------------------------ identity, copies and pickling
    def _identity(self) -> tuple[Any, ...]:
        return (*(getattr(self, f.name) for f in fields(self)), self.definition)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._identity() == other._identity()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._identity())

    def __getstate__(self) -> dict[str, Any]:
        # the parameters and the bound definition; not the caches (large tables, and a
        # compiled SymPy function that cannot be pickled), which are rebuilt on demand
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["definition"] = self.definition
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)

    # ------------------------------------------------------------------ helpers

    @cached_property
    def undefined_at_boundary(self) -> bool:
        """True when Omega blows up at ``p`` in {0, 1} (population, whitened, ``eps = 0``)."""
        if self.group_size is not None:
            return False
        kernels = self.definition.kernels
        if kernels is not None:
            return self.eps == 0 and kernels.unbounded_without_eps
        with np.errstate(divide="ignore", invalid="ignore"):
            ends = self.definition.gains(np.array([0.0, 1.0]), np.array([1.0, 0.0]), None,
                                         self, NUMPY_OPS)
        return not all(np.all(np.isfinite(x)) for x in ends)

    @property
    def constant_omega(self) -> bool:
        """True when Omega does not depend on p (mean-only; RLOO's population limit)."""
        table = self._omega(np.linspace(-30.0, 30.0, 61))
        return bool(np.ptp(table) <= 1e-12 * np.abs(table).max())

    @cached_property
    def _gains(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.group_size is not None
        return _group_gains(self)

    def _generic_weights(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Population weights straight from the definition, at ``p`` and ``1 - p`` from L."""
        succ, fail = expit(logit_p), expit(-logit_p)
        with np.errstate(divide="ignore", invalid="ignore"):  # NaN is reported below
            plus, minus = self.definition.gains(succ, fail, None, self, NUMPY_OPS)
        shape = np.shape(logit_p)  # a constant gain (succ-free) still gets the input's shape
        plus = np.broadcast_to(np.asarray(plus, dtype=np.float64), shape).copy()
        minus = np.broadcast_to(np.asarray(minus, dtype=np.float64), shape).copy()
        # at p in {0, 1} (infinite logits) NaN means "undefined at the boundary", which the
        # public methods refuse before they get here (see undefined_at_boundary)
        bad = (np.isnan(plus) | np.isnan(minus)) & np.isfinite(logit_p)
        if bad.any():
            at = float(np.broadcast_to(logit_p, shape)[bad].flat[0])
            raise ValueError(
                f"normalisation {self.normalization!r}: the population gains are not finite "
                f"(NaN) at p = {float(expit(at))!r} (logit {at!r}); gains must be finite for "
                "p in (0, 1)")
        return plus[()], minus[()]

    @cached_property
    def _generic_omega_prime(self) -> Any:
        """``d Omega / dL`` of the definition, derived by SymPy and compiled for numpy."""
        import sympy as sp

        from .normalizations import sympy_ops

        p, q = sp.symbols("p q", positive=True)
        plus, minus = self.definition.gains(p, q, None, self, sympy_ops())
        om = plus + minus
        # p = sigmoid(L), q = 1 - p: dp/dL = p q and dq/dL = -p q
        deriv = sp.simplify((sp.diff(om, p) - sp.diff(om, q)) * p * q)
        return sp.lambdify((p, q), deriv, modules="numpy")

    # Unchecked kernels for inner loops that validate their inputs once: each takes a
    # float64 ndarray of logits (+-inf allowed unless ``undefined_at_boundary``).
    def omega_unchecked(self, logit_p: np.ndarray) -> np.ndarray:
        """``Omega`` of a validated float64 logit array, without checks (inner loops)."""
        return self._omega(logit_p)

    def omega_prime_unchecked(self, logit_p: np.ndarray) -> np.ndarray:
        """``dOmega/dL`` of a validated float64 logit array, without checks (inner loops)."""
        return self._omega_prime(logit_p)

    def log_omega_unchecked(self, logit_p: np.ndarray) -> np.ndarray:
        """``log Omega`` of a validated finite float64 logit array, without checks."""
        return self._log_omega(logit_p)

    def check_boundary(self, logit_p: np.ndarray, name: str = "logit_p") -> None:
        """Raise ``ValueError`` for an infinite logit where Omega is infinite at p in {0, 1}."""
        if self.undefined_at_boundary and np.isinf(logit_p).any():
            value = float(np.asarray(logit_p)[np.isinf(logit_p)].flat[0])
            raise ValueError(
                f"{name} must be finite (p in (0, 1)) when eps=0 with population whitening "
                f"(Omega is infinite at p = 0 and 1); got {name} giving "
                f"p={1.0 if value > 0 else 0.0!r}"
            )

    # ------------------------------------------------------- unchecked kernels
    def _weights(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.group_size is not None:
            return _group_weights_of_logit(logit_p, self._gains)
        if self.definition.kernels is None:
            return self._generic_weights(logit_p)
        om = self._omega(logit_p)
        to_fail, to_succeed = expit(-logit_p), expit(logit_p)  # 1 - p and p
        with np.errstate(invalid="ignore"):  # inf * 0 far out with eps = 0, redone below
            w_plus, w_minus = om * to_fail, om * to_succeed
        # Where 1 - p (or p) is subnormal or 0 (|L| > 708) the product loses digits, and
        # with eps = 0 Omega may overflow (inf * 0 = NaN): there exp(log Omega + log(1 - p))
        # is the correctly rounded weight. Elsewhere the product is kept as it is.
        tiny = np.finfo(np.float64).tiny
        redo_plus = (to_fail < tiny) | ~np.isfinite(w_plus)
        redo_minus = (to_succeed < tiny) | ~np.isfinite(w_minus)
        if np.any(redo_plus) or np.any(redo_minus):
            lp = np.where(redo_plus | redo_minus, logit_p, 0.0)
            log_plus, log_minus = self._population_log_weights(lp)
            with np.errstate(over="ignore"):
                w_plus = np.where(redo_plus, np.exp(log_plus), w_plus)[()]
                w_minus = np.where(redo_minus, np.exp(log_minus), w_minus)[()]
        return w_plus, w_minus

    def _population_log_weights(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``log w+`` and ``log w-`` of the population calibration, finite for finite logits."""
        log_om = self._log_omega(logit_p)  # eps > 0: Omega <= 1 / eps <= 1e300, a fine log
        return log_om + _log_sigmoid(-logit_p), log_om + _log_sigmoid(logit_p)

    def _log_omega(self, logit_p: np.ndarray) -> np.ndarray:
        """``log Omega`` for finite logits, finite also where ``Omega`` overflows (``eps = 0``)."""
        kernels = self.definition.kernels
        if self.group_size is None and self.eps == 0 and kernels is not None:
            return kernels.log_inverse_without_eps(_log_bernoulli_variance(logit_p))
        with np.errstate(divide="ignore"):
            return np.log(self._omega(logit_p))

    def _log_weights(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.group_size is not None or self.definition.kernels is None:
            w_plus, w_minus = self._weights(logit_p)
            with np.errstate(divide="ignore"):
                return np.log(w_plus), np.log(w_minus)
        inf = np.isinf(logit_p)
        if np.any(inf):  # p in {0, 1}: one class has no mass, its weight is exp(-inf) = 0
            finite = np.where(inf, 0.0, logit_p)
            log_plus, log_minus = self._population_log_weights(finite)
            w_plus, w_minus = self._weights(logit_p)
            with np.errstate(divide="ignore"):
                log_plus = np.where(inf, np.log(w_plus), log_plus)[()]
                log_minus = np.where(inf, np.log(w_minus), log_minus)[()]
            return log_plus, log_minus
        return self._population_log_weights(logit_p)

    def _variance(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``p (1 - p)`` from the logit, and its log when ``eps = 0`` needs it."""
        e = np.array(np.abs(logit_p), dtype=np.float64, ndmin=0)  # an array even for 0-d input
        np.negative(e, out=e)
        np.exp(e, out=e)  # e = exp(-|L|), in place: this runs once per step on big grids
        log_v = None
        if self.eps == 0:
            log_v = -np.abs(logit_p) - 2.0 * np.log1p(e)
        denom = np.add(e, 1.0, out=np.empty_like(e))
        np.multiply(denom, denom, out=denom)
        np.divide(e, denom, out=denom)
        return denom, log_v

    def _omega(self, logit_p: np.ndarray) -> np.ndarray:
        if self.group_size is not None:
            w_plus, w_minus = _group_weights_of_logit(logit_p, self._gains)
            return w_plus + w_minus
        kernels = self.definition.kernels
        if kernels is None:
            w_plus, w_minus = self._generic_weights(logit_p)
            return w_plus + w_minus
        v, log_v = self._variance(logit_p)
        return kernels.inverse(v, log_v, self.eps, self.eps_placement)

    def _omega_prime(self, logit_p: np.ndarray) -> np.ndarray:
        if self.group_size is not None:
            d_plus, d_minus = _group_weights_prime_of_logit(logit_p, self._gains)
            return d_plus + d_minus
        kernels = self.definition.kernels
        if kernels is None:
            lp = np.asarray(logit_p, dtype=np.float64)
            d = self._generic_omega_prime(expit(lp), expit(-lp))
            return (np.zeros_like(lp) + d)[()]
        v, log_v = self._variance(logit_p)
        elasticity = kernels.elasticity(v, log_v, self.eps, self.eps_placement)
        return elasticity * -np.tanh(0.5 * logit_p)  # d v / dL = v (1 - 2p)

    # ------------------------------------------------------------- public API
    def weights_of_logit(self, logit_p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(w+, w-)`` at ``p = sigmoid(logit_p)`` (eqs. 3, 4, 13; finite-group if set).

        Each weight is correctly rounded for every logit; never NaN. With
        ``eps = 0`` and population whitening the weights are ``sqrt((1 - p) / p)``
        and ``sqrt(p / (1 - p))``: beyond ``|logit_p| = 1419`` the larger exceeds
        float64 and is ``inf`` (use :meth:`log_weights_of_logit` there), the
        smaller rounds to 0.
        """
        lp = check_logit("logit_p", logit_p)
        self.check_boundary(lp)
        return self._weights(lp)

    def log_weights_of_logit(self, logit_p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(log w+, log w-)`` at ``p = sigmoid(logit_p)``, computed in log space.

        Finite for every finite logit, also where a weight itself under- or
        overflows float64 (``eps = 0`` with ``|logit_p| > 1419``: there
        ``w-(p) = sqrt(p / (1 - p))`` exceeds the float64 range and
        :meth:`weights_of_logit` returns ``inf`` for it, and ``w+`` rounds to 0).
        A weight that is exactly 0 (a class without mass) gives ``-inf``.
        """
        lp = check_logit("logit_p", logit_p)
        self.check_boundary(lp)
        return self._log_weights(lp)

    def weights(self, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(w+(p), w-(p))``: advantage ``+w+`` on a success, ``-w-`` on a failure.

        Population weights are eq. (4) (``"sqrt"``), its practitioners' variant
        (``"std"``) or eq. (13) (``"mean_only"``); with ``group_size`` the exact
        finite-group expectations.
        """
        return self.weights_of_logit(logit(p))

    def omega_of_logit(self, logit_p: ArrayLike) -> np.ndarray:
        """``Omega = w+ + w-`` as a function of the logit (Proposition 1).

        With ``eps = 0`` and population whitening ``Omega = 1 / sqrt(p (1 - p))``
        exceeds float64 beyond ``|logit_p| = 1419`` and is returned as ``inf``.
        """
        lp = check_logit("logit_p", logit_p)
        self.check_boundary(lp)
        return self._omega(lp)

    def omega(self, p: ArrayLike) -> np.ndarray:
        """``Omega(p) = w+(p) + w-(p)``; ``(p (1 - p) + eps)^(-1/2)`` for the paper's GRPO."""
        return self.omega_of_logit(logit(p))

    def omega_prime_of_logit(self, logit_p: ArrayLike) -> np.ndarray:
        """``d Omega / d L`` with ``L = logit(p)``."""
        lp = check_logit("logit_p", logit_p)
        self.check_boundary(lp)
        return self._omega_prime(lp)

    def omega_prime(self, p: ArrayLike) -> np.ndarray:
        """``d Omega / d p`` for ``p`` in (0, 1)."""
        pp = check_probability("p", p, open_interval=True)
        lp = logit(pp)
        return self._omega_prime(lp) / np.exp(_log_bernoulli_variance(lp))

    # --------------------------------------------- shape facts for root finding
    @cached_property
    def _logit_table(self) -> np.ndarray:
        span = 60.0
        if self.eps > 0:
            span += 2.0 * math.log(1.0 / min(self.eps, 1.0))
        if self.group_size is not None:
            span += 2.0 * math.log(self.group_size)
        span = min(span, 1400.0)
        return np.linspace(-span, span, int(span / 0.01) + 1)

    @cached_property
    def omega_sup(self) -> float:
        """``sup_p Omega(p)`` (``inf`` for population whitening with ``eps = 0``)."""
        grid = self._omega(self._logit_table).max()
        ends = self._omega(np.array([-np.inf, np.inf]))
        return float(max(grid, ends.max()))

    @cached_property
    def omega_inf(self) -> float:
        """``inf_p Omega(p)``, from a fine logit grid and the limits ``p -> 0, 1``."""
        grid = self._omega(self._logit_table).min()
        ends = self._omega(np.array([-np.inf, np.inf]))
        return float(min(grid, ends.min()))

    @cached_property
    def omega_prime_extrema(self) -> np.ndarray:
        """Logits of the local extrema of ``d Omega / dL``, sorted.

        Between consecutive entries ``d Omega / dL`` is monotone, so the
        fixed-point function ``L_ref + Omega(L) / (alpha beta) - L`` is convex
        or concave there. Found on a fine grid and refined by a bounded scalar
        search.
        """
        grid = self._logit_table
        d = self._omega_prime(grid)
        step = np.sign(np.diff(d))
        turns = np.flatnonzero(step[:-1] * step[1:] < 0) + 1
        out = []
        for i in turns:
            sign = 1.0 if step[i - 1] > 0 else -1.0  # maximum if rising before

            def neg(x: float, sign: float = sign) -> float:
                return -sign * float(self._omega_prime(np.array(x)))

            res = optimize.minimize_scalar(
                neg, bounds=(grid[i - 1], grid[i + 1]), method="bounded",
                options={"xatol": 1e-12},
            )
            out.append(res.x)
        return np.array(out, dtype=np.float64)

    @cached_property
    def omega_prime_pieces(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The logit table cut at :attr:`omega_prime_extrema` into monotone pieces.

        Each entry is ``(values, logits)`` with ``values = Omega'(logits)``
        increasing; pieces where ``Omega' <= 0`` throughout are dropped.
        """
        grid = self._logit_table
        cuts = np.searchsorted(grid, self.omega_prime_extrema)
        out = []
        for part in np.split(np.arange(grid.size), cuts):
            logits = grid[part]
            values = self._omega_prime(logits)
            if values.size < 2 or values.max() <= 0:
                continue
            order = np.argsort(values, kind="stable")
            out.append((values[order], logits[order]))
        return out


def resolve_calibration(calibration: Calibration | None = None, **kwargs: Any) -> Calibration:
    """Return ``calibration`` or build one from the :func:`weights` keywords."""
    if calibration is not None:
        if kwargs:
            raise ValueError(
                f"pass either calibration= or calibration keywords, got both ({sorted(kwargs)})"
            )
        if not isinstance(calibration, Calibration):
            raise ValueError(f"calibration must be a Calibration or None, got {calibration!r}")
        return calibration
    unknown = set(kwargs) - {"normalization", "eps", "eps_placement", "group_size", "ddof"}
    if unknown:
        raise ValueError(
            f"unknown calibration keyword(s) {', '.join(sorted(unknown))}; the keywords are "
            "normalization, eps, eps_placement, group_size and ddof")
    return Calibration(**kwargs)


def weights(
    p: ArrayLike,
    *,
    eps: float = 1e-5,
    normalization: str = "mean_std",
    eps_placement: str = "sqrt",
    group_size: int | None = None,
    ddof: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Calibration weights ``(w+(p), w-(p))`` (eqs. 3, 4, 13; finite ``group_size``: exact).

    Parameters
    ----------
    p : array_like
        Success probability of the sampling policy, in [0, 1].
    eps, normalization, eps_placement, group_size, ddof
        See :class:`Calibration`.

    Returns
    -------
    w_plus, w_minus : ndarray
        Advantage of a success is ``+w_plus``, of a failure ``-w_minus``.
    """
    cal = Calibration(normalization, eps, eps_placement, group_size, ddof)
    return cal.weights(p)


def omega(p: ArrayLike, **calibration: Any) -> np.ndarray:
    """``Omega(p) = w+(p) + w-(p)`` (Proposition 1; Table 1 for each variant)."""
    return resolve_calibration(**calibration).omega(p)


def omega_of_logit(logit_p: ArrayLike, **calibration: Any) -> np.ndarray:
    """``Omega`` as a function of ``L = logit(p)``; accepts ``+-inf``."""
    return resolve_calibration(**calibration).omega_of_logit(logit_p)
