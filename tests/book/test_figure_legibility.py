"""Every figure's text is legible at the size a 1400 px screen shows it (issue 25, item 2).

The smallest font of each figure comes from the record the kernel made when the figure
was displayed; the width the page gives the image is measured in headless Chromium.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grpo_companion.plotting import MIN_TEXT_PX

from .browser import chromium
from .legibility import SCREEN_WIDTH, measure_book, notebook_figures, too_small

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def test_every_figure_is_legible_on_a_desktop_screen(driver, html_dir: Path,
                                                     toc_pages: list[str]) -> None:
    measured = measure_book(driver, html_dir, toc_pages)
    assert {p.viewport for p in measured} == {SCREEN_WIDTH}
    problems = [problem for p in measured for problem in p.problems]
    assert not problems, problems
    figures = [f for p in measured for f in p.figures]
    in_notebooks = sum(len(notebook_figures(html_dir, page)) for page in toc_pages)
    assert len(figures) == in_notebooks > 0, (len(figures), in_notebooks)
    assert sum(f.px is not None for f in figures) == len(figures), "a figure without text"
    small = too_small(figures)
    assert not small, (f"{len(small)} of {len(figures)} figures have text under "
                       f"{MIN_TEXT_PX:g} px:\n" + "\n".join(f.line() for f in small))


def test_check_reports_a_figure_the_page_shrinks(driver, html_dir: Path, tmp_path: Path,
                                                 toc_pages: list[str]) -> None:
    """The check itself: the same images, shown at a quarter of the width, are too small."""
    page = next(p for p in toc_pages if notebook_figures(html_dir, p))
    site = tmp_path / "site"
    shutil.copytree(html_dir, site)
    shutil.copytree(html_dir.parent / "stage", tmp_path / "stage")
    html = (site / page).read_text()
    shrink = "<style>article figure img { width: 25% !important; }</style></head>"
    (site / page).write_text(html.replace("</head>", shrink, 1))
    before = measure_book(driver, html_dir, [page])[0]
    after = measure_book(driver, site, [page])[0]
    assert len(after.figures) == len(before.figures) > 0
    for old, new in zip(before.figures, after.figures, strict=True):
        assert new.shown_width < 0.5 * old.shown_width
        assert new.px == pytest.approx(old.px * new.shown_width / old.shown_width)
    assert len(too_small(after.figures)) == len(after.figures)
