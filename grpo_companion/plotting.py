"""One figure style for the whole book.

Every chapter calls :func:`use_book_style` once and draws with matplotlib as
usual; :func:`variant_color` gives each GRPO variant the same colour on every
page, so that a reader can follow, say, mirror GRPO from chapter to chapter.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.ticker  # noqa: F401  (mpl.ticker)

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


def logit_ticks(ax, axis: str = "x", exponents: tuple[int, ...] = (4, 2)) -> None:
    """Sparse, readable ticks on a logit-scaled axis.

    Matplotlib labels every decade on both sides of 1/2, and labels such as
    ``1-10^-2`` and ``1-10^-4`` then run into each other. This puts ticks only
    at ``10^-k``, 1/2 and ``1 - 10^-k`` for the given ``exponents``.
    """
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    ks = sorted({int(k) for k in exponents}, reverse=True)
    ticks = [10.0 ** -k for k in ks] + [0.5] + [1 - 10.0 ** -k for k in reversed(ks)]
    labels = ([f"$10^{{-{k}}}$" for k in ks] + [r"$\frac{1}{2}$"]
              + [f"$1-10^{{-{k}}}$" for k in reversed(ks)])
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_ticks(ticks, labels)
    target.set_minor_locator(mpl.ticker.NullLocator())


def variant_color(name: str) -> str:
    """Colour of a named curve family; raises ``ValueError`` for an unknown name."""
    try:
        return VARIANT_COLORS[name]
    except KeyError:
        raise ValueError(
            f"name must be one of {sorted(VARIANT_COLORS)}, got {name!r}"
        ) from None
