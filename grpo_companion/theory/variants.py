"""A GRPO variant is a calibration times an anchor: the project's one vocabulary.

- The **calibration** (:class:`~grpo_companion.theory.Calibration`) says what
  advantage a success and a failure get (paper, eqs. 3, 4 and 13).
- The **anchor** (:class:`Anchor`) says what the KL penalty pulls towards:
  the reference policy (GRPO, eq. 6), the previous policy (Mirror GRPO,
  eq. 9) or both, with the reference share ``alpha`` (two-KL, eq. 17). It is
  data, (weight, target) pairs, and :func:`mix_targets` is the one place the
  targets are mixed: the loss's KL terms, Lemma 2's geometric anchor, the
  anchor term of the logit recurrence and the symbolic maps all go through it.

Theory functions take ``calibration=`` and ``alpha=``; the symbolic layer takes
an :class:`Anchor`; :class:`~grpo_companion.rl.TrainConfig` takes a
:class:`Variant`; Table 1's rows are variants. ``CALIBRATIONS`` holds the
named calibrations the book uses, built from the normalisations registered in
:mod:`grpo_companion.theory.normalizations`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_companion.validation import check_real

from .calibration import Calibration

__all__ = [
    "ANCHOR_KINDS",
    "ANCHOR_TARGETS",
    "CALIBRATIONS",
    "Anchor",
    "Variant",
    "calibration_named",
    "mix_targets",
    "share_pairs",
]

#: The three named kinds of anchor (:attr:`~grpo_companion.theory.Anchor.kind`).
ANCHOR_KINDS = ("reference", "mirror", "two_kl")

#: The policies a KL anchor can pull towards, in the order every mix adds them up:
#: ``"reference"`` is ``pi_ref`` (GRPO, eq. 6), ``"prev"`` is ``pi_{n-1}`` (Mirror
#: GRPO, eq. 9). This tuple is the one list of targets: :class:`Anchor` validates
#: against it and :func:`~grpo_companion.theory.variants.mix_targets` sums in its
#: order. A new target is a new name here; each consumer then supplies that policy's
#: log-probabilities (or KL to it) under the name.
ANCHOR_TARGETS: tuple[str, ...] = ("reference", "prev")


def share_pairs(alpha: Any) -> tuple[tuple[Any, str], tuple[Any, str]]:
    """The (weight, target) pairs of a reference share ``alpha`` (eq. 17).

    ``((alpha, "reference"), (1 - alpha, "prev"))``, for a number, a numpy
    array (a grid of shares) or a SymPy expression alike; not checked (the
    callers check ``alpha``), and weights 0 are kept.
    """
    return ((alpha, "reference"), (1 - alpha, "prev"))


def mix_targets(
    pairs: Iterable[tuple[Any, str]],
    terms: Mapping[str, Any],
    *,
    times: Callable[[Any, Any], Any] | None = None,
    combine: Callable[[Any, Any], Any] | None = None,
    start: Any = None,
    lazy: bool = False,
) -> Any:
    """``sum weight * terms[target]`` over the pairs: the one place an anchor's targets are mixed.

    Lemma 2's geometric anchor is this mix of the targets' log-probabilities, the
    two-KL penalty of eq. (17) this mix of the KLs to each target, and the anchor
    term of the logit recurrence (Theorem 9) this mix of the targets' logits.

    Parameters
    ----------
    pairs : iterable of (weight, target)
        ``Anchor.pairs``, or :func:`~grpo_companion.theory.variants.share_pairs`
        of a share (numbers, arrays or SymPy expressions).
    terms : mapping
        The value of each target named in ``pairs`` (extra names are ignored).
    times : callable, optional
        ``times(weight, term)`` replaces ``weight * term`` (for example a product
        with ``0 * log 0 = 0``, or ``term ** weight`` for a geometric mean).
    combine : callable, optional
        ``combine(total, part)`` replaces ``total + part``.
    start : optional
        The value the sum starts from (for example zeros of the right shape);
        without it the sum starts from the first part.
    lazy : bool
        The terms are functions of no argument, called only for the targets in
        ``pairs`` (an :class:`Anchor` keeps no zero weights, so a target it does
        not use is never computed).

    Returns
    -------
    object
        The mix, in the type of the terms.
    """
    total = start
    for weight, target in pairs:
        if target not in terms:
            raise ValueError(f"terms must give a value for each target of the anchor, "
                             f"{target!r} missing (got {sorted(terms)})")
        term = terms[target]() if lazy else terms[target]
        part = weight * term if times is None else times(weight, term)
        if total is None:
            total = part
        else:
            total = total + part if combine is None else combine(total, part)
    return total


@dataclass(frozen=True, init=False)
class Anchor:
    """What the KL penalty anchors to: ``sum_i weight_i KL(pi || target_i)`` (eq. 17).

    An anchor is data, a tuple of (weight, target) pairs with targets from
    :data:`~grpo_companion.theory.variants.ANCHOR_TARGETS`: ``((1.0, "reference"),)``
    is GRPO's penalty (eq. 6), ``((1.0, "prev"),)`` Mirror GRPO's (eq. 9), and
    ``((alpha, "reference"), (1 - alpha, "prev"))`` the two-KL penalty (eq. 17).
    The pairs are kept in the order of the targets, without zero
    weights, so equal anchors compare equal however they were written.

    Parameters
    ----------
    pairs : float or iterable of (weight, target)
        The pairs; their weights must be ``>= 0`` and sum to 1. A number is taken
        as the reference share ``alpha`` in [0, 1] (``Anchor(alpha)``, the same as
        the pairs of :func:`~grpo_companion.theory.variants.share_pairs`). Default
        ``1.0``: the reference.
    """

    pairs: tuple[tuple[float, str], ...]

    def __init__(self, pairs: float | Iterable[tuple[float, str]] = 1.0) -> None:
        if isinstance(pairs, numbers.Real) or (isinstance(pairs, np.ndarray) and pairs.ndim == 0):
            a = float(check_real("pairs (a reference share alpha)", pairs, 0.0, 1.0,
                                 scalar=True))
            given: list[tuple[float, str]] = [(float(w), t) for w, t in share_pairs(a)]
        else:
            given = _checked_pairs(pairs)
        weights = dict.fromkeys(ANCHOR_TARGETS, 0.0)
        for w, t in given:
            weights[t] += w
        object.__setattr__(self, "pairs", tuple((w, t) for t, w in weights.items() if w > 0))

    @classmethod
    def reference(cls) -> Anchor:
        """KL to the reference policy only (GRPO, eq. 6)."""
        return cls(((1.0, "reference"),))

    @classmethod
    def mirror(cls) -> Anchor:
        """KL to the previous policy only (Mirror GRPO, eq. 9)."""
        return cls(((1.0, "prev"),))

    @classmethod
    def two_kl(cls, alpha: float) -> Anchor:
        """Both KLs, with reference share ``alpha`` in (0, 1) (eq. 17)."""
        a = float(check_real("alpha", alpha, 0.0, 1.0, open_low=True, open_high=True,
                             scalar=True))
        return cls(a)

    def weight(self, target: str) -> float:
        """The weight of ``target``: 0 for a known target that the anchor does not use."""
        if target not in ANCHOR_TARGETS:
            raise ValueError(f"target must be one of {ANCHOR_TARGETS}, got {target!r}")
        return next((w for w, t in self.pairs if t == target), 0.0)

    @property
    def alpha(self) -> float:
        """The reference share: the weight of ``"reference"`` (read-only, derived)."""
        return self.weight("reference")

    @property
    def kind(self) -> str:
        """``"reference"``, ``"mirror"`` or ``"two_kl"``.

        The named kinds, :data:`~grpo_companion.theory.variants.ANCHOR_KINDS`.
        """
        if self.pairs == ((1.0, "reference"),):
            return "reference"
        if self.pairs == ((1.0, "prev"),):
            return "mirror"
        return "two_kl"

    def mix(self, terms: Mapping[str, Any], **options: Any) -> Any:
        """``sum weight * terms[target]`` over the pairs.

        :func:`~grpo_companion.theory.variants.mix_targets` with the same options.

        For example ``anchor.mix({"reference": log_ref, "prev": log_prev})`` is the
        unnormalised log of Lemma 2's geometric anchor.
        """
        return mix_targets(self.pairs, terms, **options)


def _checked_pairs(pairs: object) -> list[tuple[float, str]]:
    """``pairs`` as a list of (float weight, target), or a ValueError naming ``pairs``."""
    valid = (f"(weight, target) pairs with targets in {ANCHOR_TARGETS} and weights >= 0 "
             "summing to 1")
    try:
        if isinstance(pairs, str | bytes):
            raise TypeError
        items = [tuple(item) for item in pairs]  # type: ignore[attr-defined]
    except TypeError:
        raise ValueError(f"pairs must be a number (alpha) or {valid}, got {pairs!r}") from None
    out = []
    for item in items:
        if len(item) != 2 or item[1] not in ANCHOR_TARGETS:
            raise ValueError(f"pairs must be {valid}, got the pair {item!r}")
        w = float(check_real("pairs (a weight)", item[0], 0.0, math.inf))
        out.append((w, str(item[1])))
    total = math.fsum(w for w, _ in out)
    if not out or abs(total - 1.0) > 1e-12:
        raise ValueError(f"pairs must be {valid}, got weights summing to {total!r}")
    return out


def _calibrations() -> dict[str, Calibration]:
    return {
        # the paper's whitening: eps inside the square root, population variance (eq. 4)
        "paper": Calibration("mean_std", eps=1e-5, eps_placement="sqrt", ddof=0),
        # TRL's GRPOTrainer (scale_rewards="group"): std with Bessel's correction, + 1e-4
        "trl": Calibration("mean_std", eps=1e-4, eps_placement="std", ddof=1),
        # Dr. GRPO / TRL scale_rewards="none": centre only (eq. 13)
        "mean_only": Calibration("mean_only"),
        # REINFORCE leave-one-out baseline (RLOO)
        "rloo": Calibration("rloo"),
        # centred reward over its largest magnitude in the group
        "max_abs": Calibration("max_abs"),
    }


#: Named calibrations: ``"paper"``, ``"trl"``, ``"mean_only"``, ``"rloo"``, ``"max_abs"``.
CALIBRATIONS: dict[str, Calibration] = _calibrations()


def calibration_named(name: str) -> Calibration:
    """The calibration registered in ``CALIBRATIONS`` under ``name``."""
    if name not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {tuple(CALIBRATIONS)}, got {name!r}")
    return CALIBRATIONS[name]


@dataclass(frozen=True)
class Variant:
    """A GRPO variant: a calibration and an anchor (paper, Table 1 and Section 5).

    Parameters
    ----------
    calibration : Calibration or str
        The calibration, or the name of one in ``CALIBRATIONS``.
    anchor : Anchor
        What the KL penalty pulls towards.
    name : str
        A label for tables and legends; by default ``"<calibration>/<anchor kind>"``.
    """

    calibration: Calibration = CALIBRATIONS["paper"]
    anchor: Anchor = Anchor()
    name: str = ""

    def __post_init__(self) -> None:
        cal = self.calibration
        if isinstance(cal, str):
            object.__setattr__(self, "calibration", calibration_named(cal))
        elif not isinstance(cal, Calibration):
            raise ValueError(f"calibration must be a Calibration or one of "
                             f"{tuple(CALIBRATIONS)}, got {cal!r}")
        if not isinstance(self.anchor, Anchor):
            raise ValueError(f"anchor must be an Anchor, got {self.anchor!r}")
        if not self.name:
            object.__setattr__(self, "name",
                               f"{self.calibration.normalization}/{self.anchor.kind}")

    @property
    def alpha(self) -> float:
        """Reference share of the KL penalty (the anchor's ``alpha``)."""
        return self.anchor.alpha
