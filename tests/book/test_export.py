"""Download notebooks in plain Markdown (grpo_companion.book.export).

Unit tests on small notebooks; the built book's own download files are checked in
``test_export_built.py``.
"""

from __future__ import annotations

import nbformat
import pytest

from grpo_companion.book.export import (
    GLUE_PREFIX,
    References,
    glued_values,
    read_citations,
    reader_markdown,
    reader_notebook,
)
from grpo_companion.book.pipeline import REPO_ROOT


def _glue_output(name: str, plain: str, markdown: str | None = None) -> dict:
    data = {f"{GLUE_PREFIX}text/plain": plain}
    if markdown is not None:
        data[f"{GLUE_PREFIX}text/markdown"] = markdown
    return nbformat.v4.new_output("display_data", data=data,
                                  metadata={"scrapbook": {"name": name,
                                                          "mime_prefix": GLUE_PREFIX}})


def _notebook(markdown: str) -> nbformat.NotebookNode:
    code = nbformat.v4.new_code_cell("glue(...)")
    code.outputs = [_glue_output("p_star", "0.123456"), _glue_output("n", "12"),
                    _glue_output("name", "'mean_std'"),
                    _glue_output("table", "<table>", "| a | b |\n|---|---|\n| {ref}`sec-x` | 1 |")]
    return nbformat.v4.new_notebook(cells=[code, nbformat.v4.new_markdown_cell(markdown)])


REFS = References(
    text={"sec-x": "The section title", "thm-map": "Theorem 2.1", "eq-map": "(3)"},
    numbered={"fig-cobweb": "Fig. 4.2"},
    documents={"chapters/errata": "Errata"},
    citations={"mroueh2026grpo": ("Mroueh", "2026"),
               "shao2024deepseekmath": ("Shao et al.", "2024")},
)


def test_glued_values_are_read_from_the_outputs() -> None:
    values = glued_values(_notebook(""))
    assert set(values) == {"p_star", "n", "name", "table"}
    assert values["p_star"]["text/plain"] == "0.123456"


@pytest.mark.parametrize(("source", "shown"), [
    ("{glue:text}`p_star:.3f`", "0.123"),
    ("{glue:text}`n`", "12"),
    ("{glue:text}`name`", "mean_std"),
    ("{glue:md}`table`", "| a | b |\n|---|---|\n| The section title | 1 |"),
    ("{cite:t}`mroueh2026grpo`", "Mroueh (2026)"),
    ("{cite:p}`mroueh2026grpo,shao2024deepseekmath`", "(Mroueh, 2026; Shao et al., 2024)"),
    ("{numref}`fig-cobweb`", "Fig. 4.2"),
    ("{numref}`Figure %s <fig-cobweb>`", "Figure 4.2"),
    ("{ref}`sec-x`", "The section title"),
    ("{ref}`this section <sec-x>`", "this section"),
    ("{prf:ref}`thm-map`", "Theorem 2.1"),
    ("{eq}`eq-map`", "(3)"),
    ("{doc}`/chapters/errata`", "Errata"),
    ("{func}`grpo_companion.theory.fixed_points`", "`grpo_companion.theory.fixed_points`"),
])
def test_each_role_becomes_what_the_page_shows(source: str, shown: str) -> None:
    nb = _notebook(f"Before {source} after.")
    assert reader_notebook(nb, REFS).cells[1].source == f"Before {shown} after."


def test_boxes_become_block_quotes_and_solutions_fold() -> None:
    source = "\n".join([
        "(sec-x)=",
        "## A section",
        "",
        "```{prf:theorem} PoS map",
        ":label: thm-map",
        "",
        "The map is $h(p)$ with $p^* = $ {glue:text}`p_star:.2f`.",
        "```",
        "",
        "````{exercise}",
        ":label: ex-one",
        "",
        "Compute it.",
        "```{math}",
        "x = 1",
        "```",
        "````",
        "",
        "```{solution} ex-one",
        ":class: dropdown",
        "",
        "It is {glue:text}`n`.",
        "```",
        "",
        "$$ a = b $$ (eq-map)",
    ])
    out = reader_markdown(source, glued_values(_notebook("")), REFS)
    assert "{" not in out.replace("$h(p)$", ""), out
    assert "> **Theorem 2.1 (PoS map).**" in out
    assert "> The map is $h(p)$ with $p^* = $ 0.12." in out
    assert "> **Exercise.**" in out and "> $$" in out and "> x = 1" in out
    assert "<details>" in out and "It is 12." in out and "</details>" in out
    assert "(sec-x)=" not in out and "## A section" in out
    assert "$$ a = b $$" in out


def test_a_missing_glued_value_is_an_error_not_silent_markup() -> None:
    with pytest.raises(KeyError, match="no_such"):
        reader_markdown("{glue:text}`no_such:.2f`", {}, REFS)


def test_code_cells_and_outputs_are_kept() -> None:
    nb = _notebook("text")
    out = reader_notebook(nb, REFS)
    assert out.cells[0] == nb.cells[0]
    assert nb.cells[1].source == "text"  # the input is not modified


def test_citations_of_the_books_bibliography_are_author_year() -> None:
    cites = read_citations(REPO_ROOT / "references.bib")
    assert cites["mroueh2026grpo"] == ("Mroueh", "2026")
    assert cites["shao2024deepseekmath"][0] == "Shao et al."
    assert len(cites) >= 5


def test_a_figure_caption_follows_its_figure_as_markdown() -> None:
    nb = _notebook("text")
    figure = nbformat.v4.new_code_cell("plt.plot()")
    figure.metadata["mystnb"] = {"figure": {"name": "fig-cobweb",
                                            "caption": "The map at $p^*=${glue:text}`p_star:.2f`, "
                                                       "see {ref}`sec-x`."}}
    nb.cells.append(figure)
    out = reader_notebook(nb, REFS)
    assert len(out.cells) == len(nb.cells) + 1
    caption = out.cells[-1]
    assert caption.cell_type == "markdown" and caption.metadata["tags"] == ["figure-caption"]
    assert caption.source == "**Fig. 4.2.** The map at $p^*=$0.12, see The section title."
    assert out.cells[-2] == figure  # the figure cell itself is kept as executed
    plain = nbformat.v4.new_code_cell("x = 1")  # no caption: nothing added
    assert len(reader_notebook(nbformat.v4.new_notebook(cells=[plain]), REFS).cells) == 1
