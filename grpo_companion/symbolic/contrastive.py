"""GRPO's objective as a weighted contrastive loss (Section 2.2-2.3).

With a binary reward the advantage is ``+w_plus`` on successes and
``-w_minus`` on failures, so the PPO-style clipped surrogate splits into a
term that rewards raising the likelihood ratio on successes (capped at
``1 + clip_eps``) and a term that penalises it on failures (floored at
``1 - clip_eps``). The pointwise identity behind this is proven here by case
analysis on the three regions of the clip.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache

import sympy as sp

from .symbols import clip_eps, ratio

w_plus_sym = sp.Symbol("w_+", positive=True)
w_minus_sym = sp.Symbol("w_-", positive=True)


def clip(x: sp.Expr, low: sp.Expr, high: sp.Expr) -> sp.Expr:
    """``clip(x, low, high) = min(max(x, low), high)``."""
    return sp.Min(sp.Max(x, low), high)


def clipped_surrogate(x: sp.Expr, advantage: sp.Expr, c: sp.Expr = clip_eps) -> sp.Expr:
    """PPO/GRPO clipped surrogate ``f(x, y) = min(x y, clip(x, 1-c, 1+c) y)`` (GRPO-Clip)."""
    return sp.Min(x * advantage, clip(x, 1 - c, 1 + c) * advantage)


def _region_value(region: int, s: sp.Symbol, u: sp.Symbol) -> sp.Expr:
    """A ratio in clip region 0 (below), 1 (inside) or 2 (above).

    With fresh positive ``s`` and ``u``: ``1 - c - s`` lies below ``1 - c``,
    ``1 - c + 2 c u / (1 + u)`` lies strictly inside ``(1 - c, 1 + c)`` and
    ``1 + c + s`` lies above ``1 + c``; these cover every real ratio except the
    two clip edges, where the identity follows by continuity.
    """
    c = clip_eps
    return (1 - c - s, 1 - c + 2 * c * u / (1 + u), 1 + c + s)[region]


REGION_NAMES = ("below", "inside", "above")


@dataclass(frozen=True)
class SignCase:
    """Clipped surrogate for one sign of the advantage.

    ``identity`` is ``Eq(f(x, y), closed_form)``; ``regions`` maps each clip
    region to the simplified difference (all zero).
    """

    identity: sp.Eq
    regions: dict[str, sp.Expr]


@cache
def clipped_surrogate_by_sign() -> dict[str, SignCase]:
    """Pointwise identity behind the contrastive form (Section 2.2).

    For an advantage ``a > 0``: ``f(x, a) = a min(x, 1 + c)``.
    For an advantage ``-a < 0``: ``f(x, -a) = -a max(x, 1 - c)``.
    Each is proven on the three clip regions (see ``_region_value``).

    Returns
    -------
    dict
        ``{"positive": SignCase, "negative": SignCase}``.
    """
    a = sp.Symbol("a", positive=True)
    x, c = ratio, clip_eps
    claims = {
        "positive": (clipped_surrogate(x, a), a * sp.Min(x, 1 + c)),
        "negative": (clipped_surrogate(x, -a), -a * sp.Max(x, 1 - c)),
    }
    out = {}
    for sign, (lhs, rhs) in claims.items():
        regions = {}
        for region, name in enumerate(REGION_NAMES):
            diff = (lhs - rhs).subs(x, _region_value(region, *sp.symbols("s u", positive=True)))
            regions[name] = sp.simplify(diff)
            if regions[name] != 0:  # pragma: no cover - would falsify the identity
                raise AssertionError(f"{sign} advantage, region {name}: {regions[name]}")
        out[sign] = SignCase(sp.Eq(lhs, rhs, evaluate=False), regions)
    return out


@dataclass(frozen=True)
class ContrastiveIdentity:
    """Objective on a finite outcome space, in per-sample and contrastive form.

    Attributes
    ----------
    prev_probs, ratios:
        Symbols ``pi_old(o_i)`` and ``x_i = pi(o_i)/pi_old(o_i)``; the first
        ``n_success`` outcomes are successes.
    per_sample:
        ``E_old[f(x, A)]`` (clipped) or ``E_old[x A]`` (unclipped).
    contrastive:
        ``w_+ E_old[min(x, 1+c) 1{r=1}] - w_- E_old[max(x, 1-c) 1{r=0}]``
        (clipped) or ``w_+ P_pi(r=1) - w_- P_pi(r=0)`` (unclipped, eq. 5).
    """

    prev_probs: tuple[sp.Symbol, ...]
    ratios: tuple[sp.Symbol, ...]
    per_sample: sp.Expr
    contrastive: sp.Expr


@cache
def contrastive_identity(
    n_success: int = 2, n_failure: int = 2, clipped: bool = True
) -> ContrastiveIdentity:
    """Derive the weighted contrastive form of the GRPO objective (Section 2.2, eq. 5).

    The success weight ``w_+`` and failure weight ``w_-`` are positive symbols
    (positivity holds for every calibration in :mod:`grpo_companion.symbolic.calibration` when
    ``0 < p < 1``). For the clipped objective the equality is proven on every
    combination of clip regions of the ``n_success + n_failure`` ratios; for
    the unclipped one the importance ratio cancels, ``E_old[x 1{r}] = P_pi(r)``.

    Raises
    ------
    ValueError
        If a class is empty or the space is too large for the case analysis.
    """
    for name, n in (("n_success", n_success), ("n_failure", n_failure)):
        if not 1 <= n <= 3:
            raise ValueError(f"{name}={n} must be between 1 and 3")
    n = n_success + n_failure
    old = sp.symbols(f"pi_old1:{n + 1}", positive=True)
    xs = sp.symbols(f"x1:{n + 1}", positive=True)
    adv = [w_plus_sym] * n_success + [-w_minus_sym] * n_failure
    c = clip_eps
    if clipped:
        per_sample = sum(q * clipped_surrogate(x, a) for q, x, a in zip(old, xs, adv, strict=True))
        contrastive = w_plus_sym * sum(
            q * sp.Min(x, 1 + c) for q, x in zip(old[:n_success], xs[:n_success], strict=True)
        ) - w_minus_sym * sum(
            q * sp.Max(x, 1 - c) for q, x in zip(old[n_success:], xs[n_success:], strict=True)
        )
        _prove_on_regions(per_sample - contrastive, xs)
    else:
        per_sample = sum(q * x * a for q, x, a in zip(old, xs, adv, strict=True))
        new = [q * x for q, x in zip(old, xs, strict=True)]
        contrastive = w_plus_sym * sum(new[:n_success]) - w_minus_sym * sum(new[n_success:])
        if sp.expand(per_sample - contrastive) != 0:  # pragma: no cover
            raise AssertionError("unclipped contrastive identity failed")
    return ContrastiveIdentity(tuple(old), tuple(xs), per_sample, contrastive)


def _prove_on_regions(difference: sp.Expr, xs: tuple[sp.Symbol, ...]) -> None:
    """Check ``difference == 0`` on every assignment of clip regions to ``xs``."""
    s_syms = sp.symbols(f"s1:{len(xs) + 1}", positive=True)
    u_syms = sp.symbols(f"u1:{len(xs) + 1}", positive=True)
    for regions in itertools.product(range(3), repeat=len(xs)):
        subs = {
            x: _region_value(region, s, u)
            for x, region, s, u in zip(xs, regions, s_syms, u_syms, strict=True)
        }
        value = sp.simplify(difference.subs(subs))
        if value != 0:  # pragma: no cover - would falsify the identity
            raise AssertionError(f"clip regions {regions}: {value}")
