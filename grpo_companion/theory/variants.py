"""A GRPO variant is a calibration times an anchor: the project's one vocabulary.

- The **calibration** (:class:`~grpo_companion.theory.Calibration`) says what
  advantage a success and a failure get (paper, eqs. 3, 4 and 13).
- The **anchor** (:class:`Anchor`) says what the KL penalty pulls towards:
  the reference policy (GRPO, eq. 6), the previous policy (Mirror GRPO,
  eq. 9) or both, with the reference share ``alpha`` (two-KL, eq. 17).

Theory functions take ``calibration=`` and ``alpha=``; the symbolic layer takes
an :class:`Anchor`; :class:`~grpo_companion.rl.TrainConfig` takes a
:class:`Variant`; Table 1's rows are variants. ``CALIBRATIONS`` holds the
named calibrations the book uses, built from the normalisations registered in
:mod:`grpo_companion.theory.normalizations`.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_companion.validation import check_real

from .calibration import Calibration

__all__ = ["ANCHOR_KINDS", "CALIBRATIONS", "Anchor", "Variant", "calibration_named"]

#: The three kinds of anchor, by the reference share ``alpha`` they have.
ANCHOR_KINDS = ("reference", "mirror", "two_kl")


@dataclass(frozen=True)
class Anchor:
    """What the KL penalty anchors to: ``alpha KL(pi || pi_ref) + (1 - alpha) KL(pi || pi_old)``.

    Parameters
    ----------
    alpha : float
        Reference share, in [0, 1]. ``1``: the reference policy (GRPO, eq. 6);
        ``0``: the previous policy (Mirror GRPO, eq. 9); in between: two-KL (eq. 17).
    """

    alpha: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", float(check_real("alpha", self.alpha, 0.0, 1.0,
                                                           scalar=True)))

    @classmethod
    def reference(cls) -> Anchor:
        """KL to the reference policy only (GRPO, eq. 6)."""
        return cls(1.0)

    @classmethod
    def mirror(cls) -> Anchor:
        """KL to the previous policy only (Mirror GRPO, eq. 9)."""
        return cls(0.0)

    @classmethod
    def two_kl(cls, alpha: float) -> Anchor:
        """Both KLs, with reference share ``alpha`` in (0, 1) (eq. 17)."""
        a = float(check_real("alpha", alpha, 0.0, 1.0, open_low=True, open_high=True,
                             scalar=True))
        return cls(a)

    @property
    def kind(self) -> str:
        """``"reference"``, ``"mirror"`` or ``"two_kl"``."""
        if self.alpha == 1.0:
            return "reference"
        if self.alpha == 0.0:
            return "mirror"
        return "two_kl"


def _calibrations() -> dict[str, Calibration]:
    return {
        # the paper's whitening: eps inside the square root, population variance (eq. 4)
        "paper": Calibration("mean_std", eps=1e-5, eps_placement="sqrt", ddof=0),
        # TRL's GRPOTrainer (scale_rewards="group"): std with Bessel's correction, + 1e-4
        "trl": Calibration("mean_std", eps=1e-4, eps_placement="std", ddof=1),
        # Dr. GRPO / TRL scale_rewards="none": centre only (eq. 13)
        "dr_grpo": Calibration("mean_only"),
        # REINFORCE leave-one-out baseline (RLOO)
        "rloo": Calibration("rloo"),
        # centred reward over its largest magnitude in the group
        "max_abs": Calibration("max_abs"),
    }


#: Named calibrations: ``"paper"``, ``"trl"``, ``"dr_grpo"``, ``"rloo"``, ``"max_abs"``.
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
