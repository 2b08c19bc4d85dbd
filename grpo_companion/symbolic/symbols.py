"""Shared SymPy symbols and helpers for the symbolic derivations.

Every derivation in :mod:`grpo_companion.symbolic` is written in the same
symbols, so expressions from different modules combine and can be
``sympy.lambdify``-ed with one argument convention:
``(p, p_ref, beta, eps, alpha)``.

``p`` is the success probability of the previous policy (the paper's
:math:`p_{n-1}`), ``p_ref`` the reference policy's, ``beta`` the KL strength,
``eps`` the variance smoothing of eq. (4), ``alpha`` the reference share of the
two-KL penalty (Appendix E) and ``clip_eps`` the PPO clipping half-width.
"""

from __future__ import annotations

import sympy as sp

# Probabilities are only declared real: with ``positive=True`` SymPy would split
# ``sqrt(p*(1 - p))`` into ``sqrt(p)*sqrt(1 - p)``, which displays worse. Proofs
# that need ``0 < p < 1`` go through :func:`on_unit_interval`.
p = sp.Symbol("p", real=True)
p_ref = sp.Symbol("p_ref", real=True)
beta = sp.Symbol("beta", positive=True)
eps = sp.Symbol("varepsilon", positive=True)  # the smoothing (displays as \varepsilon)
alpha = sp.Symbol("alpha", positive=True)
clip_eps = sp.Symbol("kappa", positive=True)  # the PPO clip half-width (code: clip_eps)
ratio = sp.Symbol("x", positive=True)

#: argument order used by every ``lambdify`` helper in this package
LAMBDA_ARGS: tuple[sp.Symbol, ...] = (p, p_ref, beta, eps, alpha)


def logit(x: sp.Expr) -> sp.Expr:
    """Log-odds ``log(x / (1 - x))``."""
    return sp.log(x / (1 - x))


def sigmoid(z: sp.Expr) -> sp.Expr:
    """Logistic function ``1 / (1 + exp(-z))``, the inverse of :func:`logit`."""
    return 1 / (1 + sp.exp(-z))


def on_unit_interval(expr: sp.Expr, *variables: sp.Symbol) -> sp.Expr:
    """Rewrite ``expr`` so that each variable is known to lie in (0, 1).

    SymPy cannot assume ``0 < v < 1`` directly, so each ``v`` is replaced by
    ``1 / (1 + t_v)`` with a fresh positive ``t_v``; this parametrises the
    open unit interval exactly and lets ``simplify``/``is_positive`` use
    ``1 - v > 0``.
    """
    subs = {v: 1 / (1 + sp.Symbol(f"t_{v.name}", positive=True)) for v in variables}
    return expr.subs(subs)


def lambdify(expr: sp.Expr, args: tuple[sp.Symbol, ...] = LAMBDA_ARGS):
    """``sympy.lambdify`` to a numpy function of ``(p, p_ref, beta, eps, alpha)``."""
    return sp.lambdify(args, expr, modules="numpy")
