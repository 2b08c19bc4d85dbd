"""Reward calibrations: the weights w+(p), w-(p) and Omega(p) = w+ + w-.

A GRPO variant's advantage for a binary reward is ``+w+(p)`` on a success and
``-w-(p)`` on a failure, where ``p`` is the success probability of the policy
that sampled the group (paper, eqs. 3, 4 and 13). All PoS dynamics depend on
the calibration only through ``Omega = w+ + w-``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize
from scipy.special import expit

from ._scales import EPS_PLACEMENTS, SCALES
from ._validate import check_logit, check_probability
from .finite_group import group_gains, group_weights_of_logit, group_weights_prime_of_logit
from .logistic import log_bernoulli_variance, logit

__all__ = [
    "EPS_PLACEMENTS",
    "NORMALIZATIONS",
    "Calibration",
    "omega",
    "omega_of_logit",
    "resolve_calibration",
    "weights",
]

#: Names of the reward normalisations (also used by the torch losses of ``grpo_companion.rl``).
NORMALIZATIONS = tuple(SCALES)


@dataclass(frozen=True)
class Calibration:
    """One GRPO reward calibration; the project's single definition of each variant.

    Parameters
    ----------
    normalization : {"mean_std", "mean_only"}
        ``"mean_std"`` whitens ``(r - mean) / std`` (GRPO, paper eq. 4);
        ``"mean_only"`` only centres ``r - mean`` (Dr. GRPO, paper eq. 13).
    eps : float
        Smoothing: 0 or at least 1e-300 (subnormal values would overflow
        ``1 / eps``). Ignored by ``"mean_only"``. With ``eps = 0`` the population
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

    Notes
    -----
    **Adding a variant.** A normalisation is the function ``1 / scale(v)`` of
    the reward variance ``v``. Write it, and ``v * d(1 / scale)/dv``, as
    functions of ``log v`` in ``grpo_companion/theory/_scales.py`` and register
    them under a new name in ``SCALES``. That single entry gives the population
    weights, the finite-group weights, Omega and its derivative, hence the
    policies, the PoS maps and fixed points; the trainer and the symbolic layer
    take the same ``Calibration`` object.
    """

    normalization: str = "mean_std"
    eps: float = 1e-5
    eps_placement: str = "sqrt"
    group_size: int | None = None
    ddof: int = 0

    def __post_init__(self) -> None:
        if self.normalization not in SCALES:
            raise ValueError(
                f"normalization must be one of {sorted(SCALES)}, got {self.normalization!r}"
            )
        if self.eps_placement not in EPS_PLACEMENTS:
            raise ValueError(
                f"eps_placement must be one of {list(EPS_PLACEMENTS)}, "
                f"got {self.eps_placement!r}"
            )
        try:
            eps = float(self.eps)
        except (TypeError, ValueError) as err:
            raise ValueError(f"eps must be a number >= 0, got {self.eps!r}") from err
        if not (eps == 0 or (1e-300 <= eps and math.isfinite(eps))):
            raise ValueError(f"eps must be 0 or a finite number >= 1e-300, got {self.eps!r}")
        object.__setattr__(self, "eps", eps)
        if self.ddof not in (0, 1) or isinstance(self.ddof, bool):
            raise ValueError(f"ddof must be 0 or 1, got {self.ddof!r}")
        if self.group_size is not None:
            g = self.group_size
            if isinstance(g, bool) or not isinstance(g, int | np.integer) or g < 2:
                raise ValueError(f"group_size must be an integer >= 2 or None, got {g!r}")
            object.__setattr__(self, "group_size", int(g))

    # ------------------------------------------------------------------ helpers
    @property
    def undefined_at_boundary(self) -> bool:
        """True when Omega blows up at ``p`` in {0, 1} (population, whitened, ``eps = 0``)."""
        return (
            self.group_size is None
            and self.eps == 0
            and SCALES[self.normalization].unbounded_without_eps
        )

    @cached_property
    def _gains(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.group_size is not None
        return group_gains(
            self.group_size, self.normalization, self.eps, self.eps_placement, self.ddof
        )

    def _check_boundary(self, logit_p: np.ndarray) -> None:
        if self.undefined_at_boundary and np.isinf(logit_p).any():
            raise ValueError(
                "p must be in (0, 1) (finite logit) when eps=0 with population whitening; "
                f"got p={float(1.0 if logit_p[np.isinf(logit_p)].flat[0] > 0 else 0.0)!r}"
            )

    # ------------------------------------------------------- unchecked kernels
    def _weights(self, logit_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.group_size is not None:
            return group_weights_of_logit(logit_p, self._gains)
        om = self._omega(logit_p)
        return om * expit(-logit_p), om * expit(logit_p)

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
            w_plus, w_minus = group_weights_of_logit(logit_p, self._gains)
            return w_plus + w_minus
        v, log_v = self._variance(logit_p)
        return SCALES[self.normalization].inverse(v, log_v, self.eps, self.eps_placement)

    def _omega_prime(self, logit_p: np.ndarray) -> np.ndarray:
        if self.group_size is not None:
            d_plus, d_minus = group_weights_prime_of_logit(logit_p, self._gains)
            return d_plus + d_minus
        v, log_v = self._variance(logit_p)
        scale = SCALES[self.normalization]
        elasticity = scale.elasticity(v, log_v, self.eps, self.eps_placement)
        return elasticity * -np.tanh(0.5 * logit_p)  # d v / dL = v (1 - 2p)

    # ------------------------------------------------------------- public API
    def weights_of_logit(self, logit_p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(w+, w-)`` at ``p = sigmoid(logit_p)`` (eqs. 3, 4, 13; finite-group if set)."""
        lp = check_logit("logit_p", logit_p)
        self._check_boundary(lp)
        return self._weights(lp)

    def weights(self, p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(w+(p), w-(p))``: advantage ``+w+`` on a success, ``-w-`` on a failure.

        Population weights are eq. (4) (``"sqrt"``), its practitioners' variant
        (``"std"``) or eq. (13) (``"mean_only"``); with ``group_size`` the exact
        finite-group expectations.
        """
        return self.weights_of_logit(logit(p))

    def omega_of_logit(self, logit_p: ArrayLike) -> np.ndarray:
        """``Omega = w+ + w-`` as a function of the logit (Proposition 1)."""
        lp = check_logit("logit_p", logit_p)
        self._check_boundary(lp)
        return self._omega(lp)

    def omega(self, p: ArrayLike) -> np.ndarray:
        """``Omega(p) = w+(p) + w-(p)``; ``(p (1 - p) + eps)^(-1/2)`` for the paper's GRPO."""
        return self.omega_of_logit(logit(p))

    def omega_prime_of_logit(self, logit_p: ArrayLike) -> np.ndarray:
        """``d Omega / d L`` with ``L = logit(p)``."""
        lp = check_logit("logit_p", logit_p)
        self._check_boundary(lp)
        return self._omega_prime(lp)

    def omega_prime(self, p: ArrayLike) -> np.ndarray:
        """``d Omega / d p`` for ``p`` in (0, 1)."""
        pp = check_probability("p", p, open_interval=True)
        lp = logit(pp)
        return self._omega_prime(lp) / np.exp(log_bernoulli_variance(lp))

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
            raise ValueError(f"calibration must be a Calibration, got {calibration!r}")
        return calibration
    unknown = set(kwargs) - {"normalization", "eps", "eps_placement", "group_size", "ddof"}
    if unknown:
        raise ValueError(f"unknown calibration keyword(s) {sorted(unknown)}")
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
