"""Expected GRPO weights for a finite group of ``G`` samples (beyond the paper).

The paper whitens with the population mean ``p`` and variance ``p (1 - p)``.
Practice estimates both from the ``G`` rewards of one group. Fix one sample and
let ``S ~ Bin(G - 1, p)`` count the successes among the other ``G - 1``. The
group then has ``k = 1 + S`` successes if the sample succeeded and ``k = S`` if
it failed, its mean is ``k / G`` and its variance estimate is
``k (G - k) / (G (G - ddof))``. A group whose rewards are all equal
(``k = 0`` or ``k = G``) gets advantage 0. The expected advantage given the
sample's own reward is therefore a Bernstein polynomial in ``p``::

    w+_G(p) =  E[A | r = 1] = sum_s Bin(s; G-1, p) * (1 - (s+1)/G) / scale(v_{s+1})
    w-_G(p) = -E[A | r = 0] = sum_s Bin(s; G-1, p) * (s/G)         / scale(v_s)

Both stay finite for ``eps = 0`` and for ``p`` in {0, 1}.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ._validate import check_count, check_logit, check_memory, check_real
from .logistic import _log_bernoulli_variance, _log_sigmoid
from .normalizations import NUMPY_OPS

__all__ = ["group_gains", "group_table", "group_weights_of_logit", "group_weights_prime_of_logit"]


def group_gains(
    group_size: int, normalization: str, eps: float, eps_placement: str, ddof: int
) -> tuple[np.ndarray, np.ndarray]:
    """Advantage magnitudes for a success and a failure given ``s`` other successes.

    Returns
    -------
    gain_plus, gain_minus : ndarray of shape (group_size,)
        ``gain_plus[s] = A(r=1 | k=s+1)`` and ``gain_minus[s] = -A(r=0 | k=s)``.
    """
    from .calibration import Calibration  # the one set of checks for calibration parameters

    cal = Calibration(normalization, eps, eps_placement, check_count("group_size", group_size, 2),
                      ddof)
    assert cal.group_size is not None
    return _group_gains(cal)


def group_table(calibration: object, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(plus[k], minus[k])`` for ``k = 0..G`` successes, from the calibration's definition.

    Entry ``k`` is the advantage magnitude of a success and of a failure in a
    group of ``group_size`` samples with ``k`` successes; ``k = 0`` and
    ``k = G`` (all rewards equal) give 0. This table is what the numpy and
    torch group advantages look up.
    """
    from .calibration import Calibration

    if not isinstance(calibration, Calibration):
        raise ValueError(f"calibration must be a Calibration, got {calibration!r}")
    g = check_count("group_size", group_size, 2)
    check_memory("group_size", g, 16.0 * (g + 1), "the advantage table")
    return _group_table(calibration, g)


def _group_table(calibration: object, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    g = group_size
    k = np.arange(1, g, dtype=np.float64)
    plus, minus = np.zeros(g + 1), np.zeros(g + 1)
    if g > 1:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # reported below
            got = calibration.definition.gains(k / g, (g - k) / g, g, calibration, NUMPY_OPS)
            plus[1:g], minus[1:g] = (np.broadcast_to(np.asarray(x, dtype=np.float64), k.shape)
                                     for x in got)
        _check_table(calibration, g, plus, minus)
    return plus, minus


def _check_table(calibration: object, g: int, plus: np.ndarray, minus: np.ndarray) -> None:
    """Every gain of a group of ``g`` must be finite and ``>= 0``; name the first that is not.

    Registration tries a few group sizes only; this runs for each group size a
    calibration is used with, before any weight, fixed point or advantage is
    formed from the table (which would otherwise turn a bad gain into NaN or a
    wrong sign silently).
    """
    name = calibration.normalization
    for problem, bad in (("not finite", ~(np.isfinite(plus) & np.isfinite(minus))),
                         ("negative", (plus < 0) | (minus < 0))):
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            rule = ("must be finite" if problem == "not finite" else
                    "are magnitudes (a success gets +plus, a failure -minus) and must be >= 0")
            raise ValueError(
                f"normalisation {name!r}: gains are {problem} for group size {g} at k = {k} "
                f"successes (plus={plus[k]!r}, minus={minus[k]!r}); gains {rule} for every "
                f"0 < k < G (here {int(bad.sum())} of the {g - 1} values of k fail)")


def _group_gains(calibration: object) -> tuple[np.ndarray, np.ndarray]:
    """:func:`group_gains` of a checked calibration with a ``group_size``."""
    plus, minus = _group_table(calibration, calibration.group_size)
    # gain_plus[s]: a success with s other successes (k = s + 1); gain_minus[s]: k = s
    return plus[1:], minus[:-1]


def _binomial_pmf_of_logit(logit_p: np.ndarray, n: int) -> np.ndarray:
    """``Bin(s; n, sigmoid(L))`` for s = 0..n on a new trailing axis, computed in log space."""
    check_memory("group_size", n + 1, 32.0 * (n + 1) * max(np.size(logit_p), 1),
                 "the binomial weights of every cell")
    s = np.arange(n + 1, dtype=np.float64)
    lp = _log_sigmoid(logit_p)[..., None]
    lq = _log_sigmoid(-logit_p)[..., None]
    log_comb = special.gammaln(n + 1.0) - special.gammaln(s + 1.0) - special.gammaln(n - s + 1.0)
    with np.errstate(invalid="ignore"):
        log_pmf = log_comb + np.where(s > 0, s * lp, 0.0) + np.where(s < n, (n - s) * lq, 0.0)
    return np.exp(log_pmf)


def group_weights_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Expected weights ``(w+_G, w-_G)`` at ``p = sigmoid(logit_p)`` for the given gains.

    ``gains`` is the pair returned by :func:`group_gains`.
    """
    return _group_weights_of_logit(check_logit("logit_p", logit_p), _check_gains(gains))


def _check_gains(gains: object) -> tuple[np.ndarray, np.ndarray]:
    valid = "a pair of equal-length 1-D arrays of finite numbers (from group_gains)"
    try:
        if gains is None or isinstance(gains, str | bytes):
            raise TypeError
        plus, minus = gains  # type: ignore[misc]
        plus, minus = check_real("gains", plus), check_real("gains", minus)
    except (TypeError, ValueError) as err:
        raise ValueError(f"gains must be {valid}, got {gains!r}") from err
    if plus.ndim != 1 or plus.shape != minus.shape or plus.size < 2:
        raise ValueError(f"gains must be {valid}, got shapes {plus.shape} and {minus.shape}")
    return plus, minus


def _group_weights_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    gain_plus, gain_minus = gains
    pmf = _binomial_pmf_of_logit(np.asarray(logit_p, dtype=np.float64), gain_plus.size - 1)
    return pmf @ gain_plus, pmf @ gain_minus


def group_weights_prime_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Derivatives ``d w+_G / dL`` and ``d w-_G / dL``.

    Uses the Bernstein rule ``d/dp sum_s Bin(s; n, p) c_s = n sum_s Bin(s; n-1, p)
    (c_{s+1} - c_s)`` and ``dp/dL = p (1 - p)``.
    """
    return _group_weights_prime_of_logit(check_logit("logit_p", logit_p), _check_gains(gains))


def _group_weights_prime_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    logit_p = np.asarray(logit_p, dtype=np.float64)
    gain_plus, gain_minus = gains
    n = gain_plus.size - 1
    pmf = _binomial_pmf_of_logit(logit_p, n - 1)
    dpdl = np.exp(_log_bernoulli_variance(logit_p))
    return (
        n * dpdl * (pmf @ np.diff(gain_plus)),
        n * dpdl * (pmf @ np.diff(gain_minus)),
    )
