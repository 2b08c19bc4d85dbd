"""The built book in headless Chromium: math typeset, every figure loaded, nothing fetched
from the network."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from grpo_companion.book.pipeline import visible_figures

from .browser import chromium, inspect_page, serve

pytestmark = pytest.mark.book

CDN_MATHJAX = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


def test_pages_typeset_math_offline(driver, html_dir: Path, toc_pages: list[str]) -> None:
    problems = {}
    typeset_pages = 0
    with serve(html_dir) as base:
        for page in toc_pages:
            report = inspect_page(driver, base, page)
            assert report.requests, f"{page}: the browser made no request at all"
            if report.problems():
                problems[page] = report.problems()
            typeset_pages += report.containers > 0
    assert not problems, problems
    assert typeset_pages >= 2, "MathJax typeset math on fewer than two pages"


def test_check_fails_when_mathjax_points_at_a_cdn(driver, html_dir: Path, tmp_path: Path,
                                                  toc_pages: list[str]) -> None:
    """The check itself: a page whose MathJax comes from a CDN must be reported."""
    site = tmp_path / "site"
    shutil.copytree(html_dir, site, ignore=shutil.ignore_patterns("mathjax"))
    page = site / toc_pages[0]
    html, n = re.subn(r'src="[^"]*mathjax/tex-chtml\.js[^"]*"', f'src="{CDN_MATHJAX}"',
                      page.read_text())
    assert n == 1, "could not find the MathJax script tag to redirect"
    page.write_text(html)
    with serve(site) as base:
        report = inspect_page(driver, base, toc_pages[0])
    assert any(u.startswith(CDN_MATHJAX) for u in report.external_requests), report.requests
    assert report.problems(), "a CDN-hosted MathJax went unnoticed"
    assert report.containers == 0  # no network here: the math stays raw


def _notebook_figures(html_dir: Path, page: str) -> int:
    staged = html_dir.parent / "stage" / page.replace(".html", ".ipynb")
    return len(visible_figures(nbformat.read(staged, as_version=4))) if staged.exists() else 0


def test_every_figure_loads_in_the_browser(driver, html_dir: Path, toc_pages: list[str]) -> None:
    """Each page shows as many loaded images (naturalWidth > 0) as its notebook has figures."""
    mismatches, total = {}, 0
    with serve(html_dir) as base:
        for page in toc_pages:
            report = inspect_page(driver, base, page)
            want = _notebook_figures(html_dir, page)
            total += report.figures
            if report.figures != want or len(report.images) != want:
                mismatches[page] = (f"{report.figures} loaded figures, {len(report.images)} "
                                    f"images, {want} in the notebook")
    assert not mismatches, mismatches
    assert total > 0, "no figure on any page"


def test_figure_check_fails_when_an_image_does_not_load(driver, html_dir: Path, tmp_path: Path,
                                                        toc_pages: list[str]) -> None:
    """The check itself: delete one image file of a page and see the page reported."""
    page = next(p for p in toc_pages if _notebook_figures(html_dir, p))
    site = tmp_path / "site"
    shutil.copytree(html_dir, site)
    src = re.search(r'<img [^>]*src="([^"]+\.png)"', (site / page).read_text()).group(1)
    ((site / page).parent / src).resolve().unlink()
    with serve(site) as base:
        report = inspect_page(driver, base, page)
    assert report.figures == _notebook_figures(html_dir, page) - 1
    assert any("did not load" in p for p in report.problems()), report.images


_CAPTION_STYLE = """
const body = getComputedStyle(document.querySelector("article.bd-article p") || document.body);
return Array.from(document.querySelectorAll("figure figcaption")).map(c => {
  const t = c.querySelector(".caption-text") || c, s = getComputedStyle(t);
  return [parseInt(s.fontWeight, 10), s.color === body.color];
});
"""


def _faint_captions(driver, base: str, pages: list[str]) -> tuple[int, dict[str, list]]:
    """How many figure captions the pages show, and those lighter than text weight 400 or
    in another colour than the body text (the theme set them at weight 300)."""
    count, faint = 0, {}
    for page in pages:
        driver.get(f"{base}/{page}")
        styles = driver.execute_script(_CAPTION_STYLE)
        count += len(styles)
        bad = [s for s in styles if s[0] < 400 or not s[1]]
        if bad:
            faint[page] = bad
    return count, faint


def test_captions_are_set_like_the_text(driver, html_dir: Path, toc_pages: list[str]) -> None:
    with serve(html_dir) as base:
        count, faint = _faint_captions(driver, base, toc_pages)
    assert not faint, faint
    assert count >= 10, f"only {count} figure captions on the pages"


def test_caption_check_fails_on_a_light_caption(driver, html_dir: Path, tmp_path: Path,
                                                toc_pages: list[str]) -> None:
    """The check itself: the theme's weight 300, put back on one page, is reported."""
    page = next(p for p in toc_pages if _notebook_figures(html_dir, p))
    site = tmp_path / "site"
    shutil.copytree(html_dir, site)
    html = (site / page).read_text()
    (site / page).write_text(html.replace(
        "</head>", "<style>figure figcaption * { font-weight: 300 !important; }</style></head>",
        1))
    with serve(site) as base:
        _, faint = _faint_captions(driver, base, [page])
    assert page in faint
