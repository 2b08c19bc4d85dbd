"""One figure style for the whole book.

Every chapter calls :func:`use_book_style` once and draws with matplotlib as
usual; :func:`variant_color` gives each GRPO variant the same colour on every
page, so that a reader can follow, say, mirror GRPO from chapter to chapter.
Every registered reward normalisation has a colour too: the built-ins a fixed
one, and a normalisation registered later (with
:func:`grpo_companion.theory.register_normalization`) the next colour of
:data:`EXTRA_PALETTE`, in registration order, so a chapter can plot a new
variant without special cases.

Every figure a chapter shows must be legible at the size the page shows it: its
smallest text at least :data:`MIN_TEXT_PX` CSS pixels. In a notebook,
:func:`use_book_style` makes IPython note, beside each figure's PNG, the smallest
font it draws (:func:`text_record`); the book's tests turn that into pixels on the
page with :func:`displayed_text_px` and the image width the browser shows.
"""

from __future__ import annotations

import math

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
    # a legend drawn over data keeps its text readable: a pale box, no frame line (a curve or
    # a dotted line used to run through the legend's words, as in Fig. 9.1)
    "legend.frameon": True,
    "legend.framealpha": 0.85,
    "legend.edgecolor": "none",
    "lines.linewidth": 1.8,
    "font.size": 10,
}


#: Part of the sequential colour map that :func:`ordered_colors` samples: away from
#: viridis's near-black end (lost among black lines and text) and from its pale yellow end
#: (faint on white).
ORDERED_RANGE = (0.2, 0.85)

#: Most series :func:`ordered_colors` gives; more neighbours on one map would look alike.
MAX_ORDERED = 8


def ordered_colors(n: int, cmap: str = "viridis") -> list[tuple[float, float, float, float]]:
    """Colours for ``n`` series that have an order (KL weights, group sizes, steps).

    Evenly spaced on :data:`ORDERED_RANGE` of the sequential map ``cmap``, so that
    neighbouring series differ in lightness and none is near black.

    Raises
    ------
    ValueError
        If ``n`` is not an integer from 1 to :data:`MAX_ORDERED`, or ``cmap`` is not a
        registered colour map.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ORDERED:
        raise ValueError(f"n must be an integer from 1 to {MAX_ORDERED}, got {n!r}; "
                         "show more series as small multiples")
    if cmap not in mpl.colormaps:
        raise ValueError(f"cmap must be a registered matplotlib colour map, got {cmap!r}")
    low, high = ORDERED_RANGE
    steps = [low + (high - low) * i / max(n - 1, 1) for i in range(n)] if n > 1 \
        else [(low + high) / 2]
    return [tuple(float(c) for c in mpl.colormaps[cmap](x)) for x in steps]


def use_book_style() -> None:
    """Apply the book's matplotlib style (idempotent).

    In an IPython kernel it also records the text size of every figure displayed
    (:func:`record_text_sizes`).
    """
    mpl.rcParams.update(BOOK_STYLE)
    record_text_sizes()


#: Smallest text, in CSS pixels at the size the page shows a figure, that a reader
#: can read without zooming (the book's test of figure legibility).
MIN_TEXT_PX = 9.0

#: Key, in the ``image/png`` metadata of a displayed figure, of its :func:`text_record`.
TEXT_RECORD_KEY = "grpo_companion_text"


def drawn_text_sizes(fig) -> list[tuple[float, str]]:
    """Font size (points) and string of every text the figure draws.

    The figure is drawn once without rendering, and every text artist that
    draws a non-blank string is noted: titles, tick labels, axis labels, legend
    entries, annotations. Texts that are hidden, or belong to an axis that is
    switched off, are not drawn and so not counted.
    """
    from matplotlib.text import Text

    seen: list[tuple[float, str]] = []
    draw = Text.draw

    def noting_draw(self, renderer):
        if self.get_visible() and self.get_text().strip():
            seen.append((float(self.get_fontsize()), self.get_text()))
        return draw(self, renderer)

    Text.draw = noting_draw
    try:
        fig.draw_without_rendering()
    finally:
        Text.draw = draw
    return seen


def text_record(fig, width_px: float | None = None) -> dict:
    """What the legibility check needs of a figure: its smallest text and its scale.

    Parameters
    ----------
    fig
        A matplotlib figure.
    width_px
        The width (1x pixels) the notebook declares for the saved image; the
        figure's width times its dpi when not given (no tight bounding box).

    Returns
    -------
    dict
        ``min_pt`` (smallest font size drawn, points; ``None`` if no text),
        ``text`` (that text, shortened), ``dpi`` (the figure's dots per inch,
        at which the inline backend rasterises it at 1x), ``size_in`` (width and
        height, inches) and ``width_px``.
    """
    sizes = drawn_text_sizes(fig)
    smallest = min(sizes, key=lambda s: s[0], default=(None, ""))
    width, height = (float(x) for x in fig.get_size_inches())
    return {
        "min_pt": smallest[0],
        "text": smallest[1][:60],
        "dpi": float(fig.dpi),
        "size_in": [width, height],
        "width_px": float(width_px if width_px is not None else width * fig.dpi),
    }


def displayed_text_px(points: float, dpi: float, natural_width: float,
                      displayed_width: float) -> float:
    """Height in CSS pixels of text of ``points`` points in a figure as shown.

    A font of ``points`` points is ``points * dpi / 72`` pixels tall in an image
    rasterised at ``dpi`` whose natural (1x) width is ``natural_width`` pixels;
    shown ``displayed_width`` CSS pixels wide, the image is scaled by
    ``displayed_width / natural_width``.

    Raises
    ------
    ValueError
        If any argument is not a finite number > 0.
    """
    for name, value in (("points", points), ("dpi", dpi), ("natural_width", natural_width),
                        ("displayed_width", displayed_width)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return points * dpi / 72.0 * (displayed_width / natural_width)


def _png_width(data) -> int | None:
    """Pixel width read from a PNG's header (raw bytes or base64 text)."""
    import base64

    raw = base64.b64decode(data[:64]) if isinstance(data, str) else bytes(data[:24])
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or len(raw) < 24:
        return None
    return int.from_bytes(raw[16:20], "big")


def _recording(formatter):
    """Wrap IPython's PNG formatter of figures so that it adds a :func:`text_record`."""

    def recorded(fig):
        out = formatter(fig)
        if out is None:
            return None
        data, metadata = out if isinstance(out, tuple) else (out, {})
        metadata = dict(metadata or {})
        width = metadata.get("width") or _png_width(data)
        metadata[TEXT_RECORD_KEY] = text_record(fig, width)
        return data, metadata

    recorded._grpo_records_text = True
    return recorded


def _wrap_png_formatter(shell) -> None:
    from matplotlib.figure import Figure

    png = shell.display_formatter.formatters["image/png"]
    try:
        current = png.lookup_by_type(Figure)
    except KeyError:  # no inline backend (yet)
        return
    if not getattr(current, "_grpo_records_text", False):
        png.for_type(Figure, _recording(current))


def _load_pyplot_backend() -> None:
    """Load pyplot's backend now, as its first figure would, so that the inline backend's
    formatter exists to be wrapped before a cell's ``plt.show()`` uses it."""
    import sys

    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and not plt.get_fignums():  # switching closes figures: none open
        plt.switch_backend(mpl.rcParams["backend"])


def record_text_sizes(shell=None) -> bool:
    """Note a :func:`text_record` in the metadata of every figure IPython shows as PNG.

    Idempotent. Pyplot loads its backend (the inline backend, which registers the
    formatter) only when a cell first draws, so a pyplot already imported is made to
    load it now. The wrap is renewed before each cell runs and after it (before the
    inline backend shows the figures left open), since a later ``%matplotlib inline``
    registers a fresh formatter. Returns False (and does nothing) outside IPython.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    _load_pyplot_backend()
    _wrap_png_formatter(shell)
    for event in ("pre_run_cell", "post_execute"):  # hooks run in registration order
        if not any(getattr(h, "_grpo_records_text", False)
                   for h in shell.events.callbacks[event]):

            def renew(*_) -> None:
                _wrap_png_formatter(shell)

            renew._grpo_records_text = True
            shell.events.register(event, renew)
    return True


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
