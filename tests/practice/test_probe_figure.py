"""PoSProbeCallback's figure reads at a book's width: prompts as text, one legend, text of
9 pixels or more when shown at the text column's width (issue 25, item 2)."""

from __future__ import annotations

import matplotlib as mpl
import pytest

from grpo_companion.plotting import BOOK_STYLE, MIN_TEXT_PX, displayed_text_px, text_record
from grpo_companion.practice import PoSProbeCallback
from grpo_companion.practice.trl_callback import FIGURE_MIN_POINTS, prompt_label

#: The book's text column on a 1400 px screen is about 785 CSS pixels; a figure wider than
#: 820 px (at 1x) gets the margin too, up to about 1050 px.
TEXT_COLUMN_PX = 785
FULL_WIDTH_PX = 1050

PROMPTS = ["<bos> 0 3 + 0 7 =", "<bos> 0 4 + 0 8 =", "<bos> 0 6 + 0 7 =", "<bos> 0 7 + 0 7 ="]


def _probe(prompts=PROMPTS) -> PoSProbeCallback:
    probe = PoSProbeCallback(prompts, lambda prompt, completion: 0, None, every=2)
    for step in (0, 2, 4, 6):
        for i in range(len(prompts)):
            probe.rows.append({"prompt": i, "step": step, "measured_pos": 0.2 + 0.1 * i,
                               "n": 50, "predicted_pos": 0.25 + 0.1 * i,
                               "predicted_limit": 0.3 + 0.1 * i})
    return probe


def _shown_width(natural: float) -> float:
    """Where the book puts an image of ``natural`` 1x pixels on a 1400 px screen."""
    return min(natural, FULL_WIDTH_PX if natural > 820 else TEXT_COLUMN_PX)


def test_prompt_label_drops_special_tokens():
    assert prompt_label("<bos> 0 3 + 0 7 =") == "0 3 + 0 7 ="
    assert prompt_label("<|im_start|>user  say   A<|im_end|>") == "user say A"
    assert prompt_label([{"role": "user", "content": "say A"}]) == "say A"


def test_panels_are_titled_with_the_labels_and_share_one_legend():
    labels = [f"{a:02d} + {b:02d} =" for a, b in ((3, 7), (4, 8), (6, 7), (7, 7))]
    fig = _probe().figure(prompt_labels=labels)
    shown = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title() for ax in shown] == labels
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in shown)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "measured PoS (\u00b11 s.e.)", "recurrence", "its limit"]
    rows = {round(ax.get_position().y0, 3) for ax in shown}
    assert len(rows) == 2  # four prompts: two rows of two
    default = _probe().figure()
    assert [ax.get_title() for ax in default.axes][:1] == ["0 3 + 0 7 ="]


@pytest.mark.parametrize("count", [1, 2, 4, 5, 8])
def test_the_figure_is_legible_at_the_book_width(count):
    with mpl.rc_context(BOOK_STYLE):
        fig = _probe(PROMPTS[:1] * count if count == 1 else
                     [f"prompt {i}" for i in range(count)]).figure()
        record = text_record(fig)
    assert record["min_pt"] >= FIGURE_MIN_POINTS
    natural = record["width_px"]  # no tight crop here: an upper bound on the saved width
    px = displayed_text_px(record["min_pt"], record["dpi"], natural, _shown_width(natural))
    assert px >= MIN_TEXT_PX, (count, record, px)


@pytest.mark.parametrize("labels", [["only one"], "03 + 07 =", [1, 2, 3, 4]])
def test_prompt_labels_must_give_one_string_per_prompt(labels):
    with pytest.raises(ValueError, match=r"prompt_labels must hold one string per probe prompt"):
        _probe().figure(prompt_labels=labels)
