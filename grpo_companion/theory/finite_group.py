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

from grpo_companion.validation import check_count, check_logit, check_memory, check_real

from ._group_kernels import (
    _group_gains,
    _group_table,
    _group_weights_of_logit,
    _group_weights_prime_of_logit,
)
from .calibration import Calibration

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
    cal = Calibration(normalization, eps, eps_placement, check_count("group_size", group_size, 2),
                      ddof)
    assert cal.group_size is not None
    return _group_gains(cal)


def group_table(calibration: object, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The gains ``(gain_plus[k], gain_minus[k])`` for ``k = 0..G`` successes, from the definition.

    Entry ``k`` is the advantage magnitude of a success and of a failure in a
    group of ``group_size`` samples with ``k`` successes; ``k = 0`` and
    ``k = G`` (all rewards equal) give 0. This table is what the numpy and
    torch group advantages look up.
    """
    if not isinstance(calibration, Calibration):
        raise ValueError(f"calibration must be a Calibration, got {calibration!r}")
    g = check_count("group_size", group_size, 2)
    check_memory("group_size", g, 16.0 * (g + 1), "the advantage table")
    return _group_table(calibration, g)


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


def group_weights_prime_of_logit(
    logit_p: np.ndarray, gains: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Derivatives ``d w+_G / dL`` and ``d w-_G / dL``.

    Uses the Bernstein rule ``d/dp sum_s Bin(s; n, p) c_s = n sum_s Bin(s; n-1, p)
    (c_{s+1} - c_s)`` and ``dp/dL = p (1 - p)``.
    """
    return _group_weights_prime_of_logit(check_logit("logit_p", logit_p), _check_gains(gains))
