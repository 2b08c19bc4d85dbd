"""Monte Carlo simulation of GRPO groups with binary rewards (beyond the paper).

The paper whitens rewards with the population mean ``p`` and variance
``p (1 - p)``. An actual GRPO step samples a group of ``G`` outputs per prompt
and standardises the ``G`` rewards with their own mean and standard deviation.
This module does exactly that, the way training code does it, so that the exact
expectations of :mod:`grpo_companion.theory.finite_group` can be checked against
simulated groups:

- :func:`~grpo_companion.theory.group_advantages` turns reward groups into advantages with any
  registered calibration, from its one definition (for example
  ``(r - mean) / (std + eps)`` as in TRL's ``GRPOTrainer``, or
  ``(r - mean) / sqrt(var + eps)`` as in the paper's eq. (4)); a group whose
  rewards are all equal gets advantage 0 (also when ``eps = 0``);
- :func:`sample_groups` draws groups of i.i.d. Bernoulli(``p``) rewards;
- :func:`estimate_group_weights` estimates ``w+_G(p) = E[A | r = 1]`` and
  ``w-_G(p) = -E[A | r = 0]`` with standard errors.

Estimator. Groups are i.i.d.; samples inside a group are not independent (they
share the group's mean and standard deviation). With ``X_g = sum_i A_gi r_gi``
and ``Y_g = sum_i r_gi`` summed over group ``g``, exchangeability of the samples
gives ``E[A | r = 1] = E[X] / E[Y]``, so ``w+`` is estimated by the ratio of the
group means and its standard error by the delta method over groups (likewise
for failures and for ``Omega = w+ + w-``). This uses every sample and gets the
within-group correlation right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from grpo_companion.validation import (
    check_count,
    check_memory,
    check_probability,
    check_real,
    check_seed,
)

from ._group_kernels import _group_table
from .calibration import Calibration, resolve_calibration

__all__ = ["GroupWeightEstimate", "estimate_group_weights", "group_advantages", "sample_groups"]


def group_advantages(
    rewards: ArrayLike, calibration: Calibration | None = None, **keywords: Any
) -> np.ndarray:
    """Group-relative advantages of 0/1 rewards, one group per row of the last axis.

    Derived from the calibration's definition
    (:mod:`~grpo_companion.theory.normalizations`): a success in a group with
    ``k`` successes gets ``+plus(k, G)``, a failure ``-minus(k, G)``; a group
    whose rewards are all equal gets 0. For ``"mean_std"`` this is
    ``(r - mean) / sqrt(var + eps)`` (paper, eq. 4) or ``(r - mean) / (std + eps)``.

    Parameters
    ----------
    rewards : array_like, shape (..., G)
        Verifiable rewards, each 0 or 1, of each group along the last axis (``G >= 2``).
    calibration : Calibration, optional
        Default: ``Calibration()``, the paper's eq. (4). Or pass the
        :class:`~grpo_companion.theory.Calibration` keywords (``normalization``,
        ``eps``, ``eps_placement``, ``ddof``) instead.

    Returns
    -------
    ndarray
        Same shape as ``rewards``.
    """
    r = check_real("rewards", rewards)
    if r.ndim == 0 or r.shape[-1] < 2:
        raise ValueError(f"rewards must have a last axis of length >= 2, got shape {r.shape}")
    cal = resolve_calibration(calibration, **keywords)
    return _table_advantages(r, cal)


def _table_advantages(r: np.ndarray, cal: Calibration) -> np.ndarray:
    """Look up each reward's advantage in the calibration's ``(k, G)`` table."""
    g = r.shape[-1]
    if cal.group_size is not None and cal.group_size != g:
        raise ValueError(f"calibration has group_size={cal.group_size} but the groups have "
                         f"{g} rewards; pass a calibration with group_size=None or {g}")
    binary = (r == 0) | (r == 1)
    if not np.all(binary):
        bad = r[~binary].flat[0]
        raise ValueError(f"rewards must each be 0 or 1 (verifiable rewards), got {bad!r}")
    if cal.ddof >= g:
        raise ValueError(f"group size must exceed ddof={cal.ddof}, got {g}")
    plus, minus = _group_table(cal, g)
    k = r.sum(axis=-1, keepdims=True).astype(np.int64)
    return np.where(r == 1, plus[k], -minus[k])


def sample_groups(
    p: ArrayLike, group_size: int, n_groups: int, *, seed: int | np.random.Generator = 0
) -> np.ndarray:
    """Draw ``n_groups`` groups of ``group_size`` i.i.d. Bernoulli(``p``) rewards.

    Returns
    -------
    ndarray of float, shape ``(*p.shape, n_groups, group_size)``
        Rewards in {0, 1}.
    """
    pp = check_probability("p", p)
    g = check_count("group_size", group_size, 2)
    n = check_count("n_groups", n_groups, 1)
    check_seed("seed", seed)
    check_memory("group_size * n_groups", f"{g} * {n}", 16.0 * pp.size * n * g, "the rewards")
    rng = np.random.default_rng(seed)
    u = rng.random((*pp.shape, n, g))
    return (u < pp[..., None, None]).astype(np.float64)


@dataclass(frozen=True)
class GroupWeightEstimate:
    """Monte Carlo estimates of the finite-group weights (see the module docstring).

    Attributes
    ----------
    w_plus, w_minus, omega : ndarray
        Estimates of ``E[A | r = 1]``, ``-E[A | r = 0]`` and their sum, shape of ``p``.
    se_plus, se_minus, se_omega : ndarray
        Their delta-method standard errors over groups.
    n_success, n_failure : ndarray of int
        Number of successful and failed samples drawn.
    n_groups, group_size : int
    """

    w_plus: np.ndarray
    w_minus: np.ndarray
    omega: np.ndarray
    se_plus: np.ndarray
    se_minus: np.ndarray
    se_omega: np.ndarray
    n_success: np.ndarray
    n_failure: np.ndarray
    n_groups: int
    group_size: int


def estimate_group_weights(
    p: ArrayLike,
    n_groups: int,
    *,
    seed: int | np.random.Generator = 0,
    calibration: Calibration | None = None,
    max_chunk_values: int = 2**22,
    **calibration_kwargs: Any,
) -> GroupWeightEstimate:
    """Estimate ``w+_G(p)``, ``w-_G(p)`` and ``Omega_G(p)`` from simulated groups.

    Parameters
    ----------
    p : array_like
        Success probabilities in (0, 1); one independent simulation per entry.
    n_groups : int
        Groups drawn per entry of ``p``.
    seed : int or Generator
        Random seed (results are deterministic for a given seed).
    calibration : Calibration, optional
        Must have ``group_size`` set; or pass the
        :func:`~grpo_companion.theory.weights` keywords (``group_size`` required),
        e.g. TRL's ``eps=1e-4, eps_placement="std", ddof=1``.
    max_chunk_values : int
        Groups are simulated in chunks of at most this many rewards (memory bound).

    Raises
    ------
    ValueError
        If ``p`` is not in (0, 1), ``group_size`` is unset, or a reward class
        was never drawn for some ``p`` (increase ``n_groups``).
    """
    cal = resolve_calibration(calibration, **calibration_kwargs)
    if cal.group_size is None:
        raise ValueError("group_size must be set (an integer >= 2), got None")
    pp = check_probability("p", p, open_interval=True)
    n = check_count("n_groups", n_groups, 2)
    check_seed("seed", seed)
    max_chunk_values = check_count("max_chunk_values", max_chunk_values, 1)
    g = cal.group_size
    flat = pp.ravel()
    m = flat.size
    chunk = max(1, max_chunk_values // max(1, m * g))
    check_memory("max_chunk_values", max_chunk_values, 64.0 * m * g * min(chunk, n),
                 "one chunk of simulated groups")
    rng = np.random.default_rng(seed)
    # per entry of p: sums of Z = (X_s, Y_s, X_f, Y_f) and of Z Z^T over groups
    s1 = np.zeros((m, 4))
    s2 = np.zeros((m, 4, 4))
    done = 0
    while done < n:
        k = min(chunk, n - done)
        rewards = (rng.random((m, k, g)) < flat[:, None, None]).astype(np.float64)
        adv = _table_advantages(rewards, cal)
        z = np.stack([np.sum(adv * rewards, axis=-1), np.sum(rewards, axis=-1),
                      np.sum(adv * (1.0 - rewards), axis=-1), np.sum(1.0 - rewards, axis=-1)],
                     axis=-1)  # (m, k, 4)
        s1 += z.sum(axis=1)
        s2 += np.einsum("mki,mkj->mij", z, z)
        done += k
    mean = s1 / n
    if (mean[:, 1] == 0).any() or (mean[:, 3] == 0).any():
        bad = flat[(mean[:, 1] == 0) | (mean[:, 3] == 0)][0]
        raise ValueError(
            f"no success or no failure was drawn at p={bad!r} with n_groups={n}; "
            "increase n_groups"
        )
    cov = (s2 - n * mean[:, :, None] * mean[:, None, :]) / (n - 1)
    w_plus = mean[:, 0] / mean[:, 1]
    w_minus = -mean[:, 2] / mean[:, 3]
    zero = np.zeros(m)
    grad_plus = np.stack([1.0 / mean[:, 1], -w_plus / mean[:, 1], zero, zero], axis=-1)
    grad_minus = np.stack([zero, zero, -1.0 / mean[:, 3], -w_minus / mean[:, 3]], axis=-1)

    def se(grad: np.ndarray) -> np.ndarray:
        var = np.einsum("mi,mij,mj->m", grad, cov, grad) / n
        return np.sqrt(np.maximum(var, 0.0))

    shape = pp.shape
    return GroupWeightEstimate(
        w_plus=w_plus.reshape(shape),
        w_minus=w_minus.reshape(shape),
        omega=(w_plus + w_minus).reshape(shape),
        se_plus=se(grad_plus).reshape(shape),
        se_minus=se(grad_minus).reshape(shape),
        se_omega=se(grad_plus + grad_minus).reshape(shape),
        n_success=np.rint(s1[:, 1]).astype(np.int64).reshape(shape),
        n_failure=np.rint(s1[:, 3]).astype(np.int64).reshape(shape),
        n_groups=n,
        group_size=g,
    )

