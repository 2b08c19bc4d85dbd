"""Every registered normalisation has a colour: fixed for the built-ins, assigned in
registration order for the ones a reader adds."""

from __future__ import annotations

import pytest

from grpo_companion import plotting, theory
from grpo_companion.plotting import EXTRA_PALETTE, VARIANT_COLORS, variant_color
from grpo_companion.theory.normalizations import NORMALIZATIONS


def _centred(succ, fail, n, cal, ops):
    return fail, succ


@pytest.fixture
def fresh_colours(monkeypatch):
    """An empty assignment table, so the test does not depend on earlier registrations."""
    monkeypatch.setattr(plotting, "_ASSIGNED", {})


def test_built_in_normalisations_have_their_fixed_colours():
    for name in ("mean_std", "mean_only", "rloo", "max_abs"):
        assert name in NORMALIZATIONS
        assert variant_color(name) == VARIANT_COLORS[name]
    assert variant_color("mean_only") == "#2ca02c"  # unchanged since the first chapters
    assert variant_color("mean_std") == variant_color("reference")  # GRPO is GRPO
    assert len(set(EXTRA_PALETTE)) == len(EXTRA_PALETTE)
    assert not set(EXTRA_PALETTE) & set(VARIANT_COLORS.values())


def test_every_registered_normalisation_has_a_colour(fresh_colours):
    for name in NORMALIZATIONS:
        assert variant_color(name).startswith("#")


def test_later_registrations_get_palette_colours_in_registration_order(fresh_colours):
    names = ["colour_test_a", "colour_test_b", "colour_test_c"]
    for name in names:
        theory.register_normalization(name, _centred, summary="for the colour test")
    try:
        before = [n for n in NORMALIZATIONS if n not in VARIANT_COLORS and n not in names]
        # asked for in another order than registered: the colours follow registration
        got = {name: variant_color(name) for name in reversed(names)}
        offset = len(before)
        for i, name in enumerate(names):
            assert got[name] == EXTRA_PALETTE[(offset + i) % len(EXTRA_PALETTE)]
        assert len(set(got.values())) == len(names)
        assert variant_color("colour_test_b") == got["colour_test_b"]  # stable
        theory.unregister_normalization("colour_test_a")
        assert variant_color("colour_test_c") == got["colour_test_c"]  # others keep theirs
        with pytest.raises(ValueError, match="registered normalisation"):
            variant_color("colour_test_a")  # no longer registered
    finally:
        for name in names:
            if name in NORMALIZATIONS:
                theory.unregister_normalization(name)


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="got 'no_such_variant'"):
        variant_color("no_such_variant")


# ------------------------------------------------------------------ legibility


def test_displayed_text_px_is_points_at_the_dpi_scaled_to_the_shown_width():
    # 72 pt at 100 dpi is 100 px in the image; shown at half the natural width, 50 px
    assert plotting.displayed_text_px(72, 100, 800, 400) == pytest.approx(50.0)
    # the Fig. 11.1: 8 pt at 110 dpi in a 1508 px wide image shown 1050 px wide
    assert plotting.displayed_text_px(8, 110, 1508, 1050) == pytest.approx(8.51, abs=0.01)
    # the book style's 9 pt legend at 110 dpi, shown at its natural width: 13.75 px
    assert plotting.displayed_text_px(9, 110, 700, 700) == pytest.approx(13.75)


@pytest.mark.parametrize("name, args", [
    ("points", (0, 110, 800, 800)), ("dpi", (9, -1, 800, 800)),
    ("natural_width", (9, 110, float("nan"), 800)), ("displayed_width", (9, 110, 800, "800")),
])
def test_displayed_text_px_refuses_non_positive_or_non_numbers(name, args):
    with pytest.raises(ValueError, match=f"{name} must be a finite number > 0"):
        plotting.displayed_text_px(*args)


def _small_legend_figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3), dpi=100)
    left, right = fig.subplots(1, 2)
    left.plot([0, 1], [0, 1], label="a line")
    left.legend(fontsize=6)
    left.set_title("left", fontsize=12)
    left.text(0.5, 0.5, "hidden", fontsize=3, visible=False)
    left.text(0.5, 0.2, "   ", fontsize=2)  # blank: draws nothing a reader could read
    right.tick_params(labelsize=4)
    right.set_axis_off()  # its 4 pt tick labels are not drawn
    return fig


def test_text_record_finds_the_smallest_text_drawn():
    record = plotting.text_record(_small_legend_figure())
    assert record["min_pt"] == 6.0
    assert record["text"] == "a line"
    assert record["dpi"] == 100.0
    assert record["size_in"] == [6.0, 3.0]
    assert record["width_px"] == 600.0  # no width given: the figure's own


def test_text_record_of_a_figure_without_text():
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.set_axis_off()
    assert plotting.text_record(fig, 320)["min_pt"] is None
    assert plotting.text_record(fig, 320)["width_px"] == 320.0


def test_ipython_records_the_text_of_every_figure_it_shows():
    """What the book's kernels do: the inline backend's retina PNG gains the record."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core.pylabtools import select_figure_formats
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()
    shell.display_formatter.formatters["image/png"].pop(Figure, None)
    assert plotting.record_text_sizes(shell)  # no inline backend yet: pyplot loads it lazily
    assert plotting.record_text_sizes(shell)  # idempotent: one hook per event
    for event in ("pre_run_cell", "post_execute"):
        assert len([h for h in shell.events.callbacks[event]
                    if getattr(h, "_grpo_records_text", False)]) == 1
    # the first cell that draws loads the backend, which registers its formatter; the hook
    # after the cell wraps it before the backend shows the cell's figures
    select_figure_formats(shell, {"retina"}, bbox_inches="tight")
    shell.events.trigger("post_execute")
    fig = _small_legend_figure()
    _, metadata = shell.display_formatter.format(fig)
    png = metadata["image/png"]
    record = png[plotting.TEXT_RECORD_KEY]
    assert record["min_pt"] == 6.0 and record["width_px"] == png["width"] < 600
    # a later `%matplotlib inline` registers a fresh formatter; the next cell wraps it again
    select_figure_formats(shell, {"retina"}, bbox_inches="tight")
    assert plotting.TEXT_RECORD_KEY not in shell.display_formatter.format(fig)[1]["image/png"]
    shell.events.trigger("pre_run_cell", None)
    assert plotting.TEXT_RECORD_KEY in shell.display_formatter.format(fig)[1]["image/png"]


def test_the_legibility_check_fails_a_figure_with_tiny_text():
    """6 pt at 100 dpi in a 600 px figure shown 600 px wide is 8.3 px: under the limit."""
    record = plotting.text_record(_small_legend_figure())
    px = plotting.displayed_text_px(record["min_pt"], record["dpi"], record["width_px"], 600)
    assert px < plotting.MIN_TEXT_PX


def _lab_lightness_and_distance(a, b):
    """CIE L* of ``a`` and the CIE76 distance from ``a`` to ``b`` (sRGB, D65)."""
    import numpy as np

    def lab(rgb):
        c = np.asarray(rgb[:3], dtype=float)
        lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
        xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                        [0.0193, 0.1192, 0.9505]]) @ lin / np.array([0.9505, 1.0, 1.089])
        f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    return float(lab(a)[0]), float(np.linalg.norm(lab(a) - lab(b)))


@pytest.mark.parametrize("n", range(2, plotting.MAX_ORDERED + 1))
def test_ordered_colours_are_apart_and_none_is_near_black(n):
    colours = plotting.ordered_colors(n)
    assert len(colours) == n
    for a, b in zip(colours, colours[1:], strict=False):
        lightness, distance = _lab_lightness_and_distance(a, b)
        assert distance >= 8, (n, a, b, distance)
        assert lightness >= 30, (n, a, lightness)


def test_the_colour_check_fails_on_viridis_from_its_dark_end():
    import matplotlib as mpl

    darkest = mpl.colormaps["viridis"](0.0)
    assert _lab_lightness_and_distance(darkest, (0.0, 0.0, 0.0))[0] < 30
    close = [mpl.colormaps["viridis"](x) for x in (0.0, 0.04)]
    assert _lab_lightness_and_distance(*close)[1] < 8


@pytest.mark.parametrize("n", [0, 9, 2.0, True])
def test_ordered_colours_refuse_too_many_or_non_integers(n):
    with pytest.raises(ValueError, match="n must be an integer from 1 to 8"):
        plotting.ordered_colors(n)


def test_ordered_colours_refuse_an_unknown_map():
    with pytest.raises(ValueError, match="cmap must be a registered"):
        plotting.ordered_colors(3, cmap="no-such-map")
    assert len(plotting.ordered_colors(1)) == 1


@pytest.mark.slow
def test_a_book_kernel_records_every_figure_a_chapter_shows():
    """In the kernel the book runs chapters in, the first figure of a chapter is recorded
    too (pyplot loads its inline backend lazily, at the first ``plt.show()``; without
    loading it at ``use_book_style()`` that figure went unrecorded in the first build)."""
    import nbclient
    from nbformat.v4 import new_code_cell, new_notebook

    from grpo_companion.book.kernel import kernel_session
    from grpo_companion.book.pipeline import KERNEL_NAME, visible_figures

    draw = "fig, ax = plt.subplots()\nax.plot([0, 1], label='a line')\nax.legend()\nplt.show()"
    nb = new_notebook(cells=[
        new_code_cell("import matplotlib.pyplot as plt\n"
                      "from grpo_companion.plotting import use_book_style\nuse_book_style()"),
        new_code_cell(draw), new_code_cell(draw)])
    with kernel_session() as session:
        nbclient.NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=120,
                                kernel_manager_class=session.manager_class).execute()
    figures = visible_figures(nb)
    assert len(figures) == 2
    for figure in figures:
        assert figure.text is not None and figure.text["min_pt"] == 9.0  # the legend's
        assert figure.text["dpi"] == 110.0 and figure.text["width_px"] > 0
