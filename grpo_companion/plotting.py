"""One figure style for the whole book.

Every chapter calls :func:`use_book_style` once and draws with matplotlib as
usual; :func:`variant_color` gives each GRPO variant the same colour on every
page, so that a reader can follow, say, mirror GRPO from chapter to chapter.
Every registered reward normalisation has a colour too: the built-ins a fixed
one, and a normalisation registered later (with
:func:`grpo_companion.theory.register_normalization`) the next colour of
:data:`EXTRA_PALETTE`, in registration order, so a chapter can plot a new
variant without special cases.
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
    "mean_std": "#1f77b4",  # GRPO's whitening (paper eq. 4), as the reference anchor
    "rloo": "#ff7f0e",  # leave-one-out baseline
    "max_abs": "#8c564b",  # centred, divided by the largest |r - mean|
    "w_plus": "#2ca02c",  # weight on successes
    "w_minus": "#d62728",  # weight on failures
    "omega": "#1f77b4",  # w_plus + w_minus
    "identity": "#7f7f7f",  # the diagonal y = p
}

#: Colours for normalisations registered after the built-ins, in registration order
#: (none of them is a colour of :data:`VARIANT_COLORS`); cycled if there are more.
EXTRA_PALETTE = ("#e377c2", "#17becf", "#bcbd22", "#ff9896", "#98df8a", "#c5b0d5",
                 "#c49c94", "#9edae5")

#: Colours given so far to registered normalisations without a fixed one (kept for the
#: session, so a name keeps its colour even if others are unregistered later).
_ASSIGNED: dict[str, str] = {}

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


def _registered_names() -> tuple[str, ...]:
    """Names in the normalisation registry, in registration order."""
    from grpo_companion.theory.normalizations import NORMALIZATIONS

    return tuple(NORMALIZATIONS)


def variant_color(name: str) -> str:
    """Colour of a named curve family or of any registered normalisation.

    Fixed names (anchors, weights, the built-in normalisations) have their
    entry of :data:`VARIANT_COLORS`. A normalisation registered later gets the
    next colour of :data:`EXTRA_PALETTE`: the registered names without a fixed
    colour are numbered in registration order the first time any of them is
    asked for, and keep their colour afterwards (also if unregistered and
    registered again).

    Raises
    ------
    ValueError
        If ``name`` is neither a fixed name nor a registered normalisation.
    """
    if name in VARIANT_COLORS:
        return VARIANT_COLORS[name]
    registered = _registered_names()
    if name not in registered:
        raise ValueError(
            f"name must be one of {sorted(VARIANT_COLORS)} or a registered normalisation "
            f"{sorted(set(registered) - set(VARIANT_COLORS))}, got {name!r}")
    for other in registered:  # registration order; earlier assignments are kept
        if other not in VARIANT_COLORS and other not in _ASSIGNED:
            _ASSIGNED[other] = EXTRA_PALETTE[len(_ASSIGNED) % len(EXTRA_PALETTE)]
    return _ASSIGNED[name]
