"""One figure style for the whole book.

Every chapter calls :func:`use_book_style` once and draws with matplotlib as
usual; :func:`variant_color` gives each GRPO variant the same colour on every
page, so that a reader can follow, say, mirror GRPO from chapter to chapter.
"""

from __future__ import annotations

import matplotlib as mpl

#: Colour of each named curve family, shared by all chapters.
VARIANT_COLORS = {
    "reference": "#1f77b4",  # GRPO with KL to pi_ref (alpha = 1)
    "mirror": "#d62728",  # KL to the previous policy (alpha = 0)
    "two_kl": "#9467bd",  # both, 0 < alpha < 1
    "mean_only": "#2ca02c",  # Dr. GRPO calibration
    "w_plus": "#2ca02c",  # weight on successes
    "w_minus": "#d62728",  # weight on failures
    "omega": "#1f77b4",  # w_plus + w_minus
    "identity": "#7f7f7f",  # the diagonal y = p
}

BOOK_STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 1.8,
    "font.size": 10,
}


def use_book_style() -> None:
    """Apply the book's matplotlib style (idempotent)."""
    mpl.rcParams.update(BOOK_STYLE)


def variant_color(name: str) -> str:
    """Colour of a named curve family; raises ``ValueError`` for an unknown name."""
    try:
        return VARIANT_COLORS[name]
    except KeyError:
        raise ValueError(
            f"name must be one of {sorted(VARIANT_COLORS)}, got {name!r}"
        ) from None
