"""Convergence checks for tests that compare against a numerical reference.

A test that compares a closed form with an optimiser, a root finder or a long
iteration must first show that its reference converged, and then take its
tolerance from that convergence measure (plus a few ulps of rounding), not from
a number that happened to pass on one machine. The helpers below give the
measures used in ``tests/theory``:

- :func:`simplex_kkt_spread`: the KKT residual of a maximisation over the
  probability simplex, in probability coordinates. At an interior optimum every
  partial derivative ``dJ/dpi_i`` equals the same multiplier, so the spread
  ``max_i dJ/dpi_i - min_i dJ/dpi_i`` is zero. It equals the spread of the
  softmax-logit gradient *divided by the probabilities*, so a tiny probability
  cannot hide an unconverged coordinate (BFGS's ``gtol`` in logits can).
- :func:`newton_polish_simplex`: Newton steps on that KKT system with the
  objective's own gradient and (diagonal) Hessian in ``pi``; quadratic
  convergence from an optimiser's approximate answer.
- :func:`brent_root`: ``brentq`` with ``full_output``, asserting convergence and
  returning the guaranteed bracket half-width ``xtol + rtol |x|``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import optimize

EPS = float(np.finfo(np.float64).eps)
#: ulps allowed per rounded quantity: each formula here takes a handful of
#: correctly rounded operations (log, exp, a product, a sum), each <= 1/2 ulp.
ULPS = 16


def simplex_kkt_spread(grad_pi: np.ndarray) -> float:
    """``max - min`` of ``dJ/dpi`` over the outcomes: 0 exactly at an interior optimum."""
    grad_pi = np.asarray(grad_pi, dtype=float)
    return float(grad_pi.max() - grad_pi.min())


def newton_polish_simplex(
    pi: np.ndarray,
    grad: Callable[[np.ndarray], np.ndarray],
    hess_diag: Callable[[np.ndarray], np.ndarray],
    max_steps: int = 20,
) -> tuple[np.ndarray, float]:
    """Maximise a strictly concave ``J(pi)`` on the simplex from ``pi`` by Newton steps.

    ``grad(pi)`` is ``dJ/dpi`` and ``hess_diag(pi)`` the (negative) diagonal of its
    Hessian. Each step solves ``H d - mu 1 = -g, sum d = 0`` and is halved until
    every probability stays positive. Stops when the KKT spread stops decreasing
    (the rounding floor); returns the best iterate and its spread.
    """
    pi = np.asarray(pi, dtype=float).copy()
    best, best_spread = pi.copy(), simplex_kkt_spread(grad(pi))
    for _ in range(max_steps):
        g, h = grad(pi), hess_diag(pi)
        mu = np.sum(g / h) / np.sum(1.0 / h)
        step = (mu - g) / h
        t = 1.0
        while np.any(pi + t * step <= 0):
            t *= 0.5
        pi = pi + t * step
        pi /= pi.sum()
        spread = simplex_kkt_spread(grad(pi))
        if spread >= best_spread:
            break
        best, best_spread = pi.copy(), spread
    return best, best_spread


def brent_root(f: Callable[[float], float], a: float, b: float, xtol: float,
               rtol: float = 4 * EPS, maxiter: int = 100) -> tuple[float, float]:
    """``brentq`` on ``[a, b]``; returns the root and the half-width of its final bracket.

    scipy's Brent stops when the bracket around the returned point is shorter than
    ``xtol + rtol |x|``, so the sign change of ``f`` (as evaluated) lies within that
    distance of the returned point.
    """
    x, info = optimize.brentq(f, a, b, xtol=xtol, rtol=rtol, maxiter=maxiter, full_output=True,
                             disp=False)
    assert info.converged, f"brentq did not converge on [{a}, {b}]: {info.flag}"
    return x, xtol + rtol * abs(x)
