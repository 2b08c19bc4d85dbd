"""Static checks of the built HTML: every page exists, no errors, every figure of every
chapter shown (numbered, captioned, described, sharp, cited), nothing loaded from another
host."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grpo_companion.book.pipeline import REPO_ROOT

from .figures import check_page, links_in_book, source_figure_cells

#: The book had 44 figures when this check was last updated (35 before chapter 10 added
#: four, 39 before chapter 11 added five): a floor, so that losing the figure metadata of
#: many cells at once cannot pass as "nothing to check".
MIN_FIGURES = 49

pytestmark = pytest.mark.book

ERROR_MARKERS = (
    "Traceback (most recent call last)",
    'class="output traceback',
    'class="output error',
    "output stderr",
)


class _Refs(HTMLParser):
    """Collects the resources a page asks the browser to load."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])
        elif tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        elif tag == "link" and a.get("rel") in ("stylesheet", "preload") and a.get("href"):
            self.styles.append(a["href"])


def _refs(page: Path) -> _Refs:
    parser = _Refs()
    parser.feed(page.read_text())
    return parser


def test_every_toc_entry_has_a_page(html_dir: Path, toc_pages: list[str]) -> None:
    missing = [p for p in toc_pages if not (html_dir / p).exists()]
    assert not missing, f"toc entries without a page: {missing}"


def test_no_error_output_in_any_page(html_dir: Path, toc_pages: list[str]) -> None:
    bad = {}
    for page in toc_pages:
        text = (html_dir / page).read_text()
        hits = [m for m in ERROR_MARKERS if m in text]
        if hits:
            bad[page] = hits
    assert not bad, f"pages with error output: {bad}"


def test_every_referenced_figure_exists(html_dir: Path, toc_pages: list[str]) -> None:
    missing = []
    for page in toc_pages:
        path = html_dir / page
        for src in _refs(path).images:
            if src.startswith("data:"):
                continue
            target = (path.parent / src.split("#")[0].split("?")[0]).resolve()
            if not target.exists():
                missing.append(f"{page}: {src}")
    assert not missing, f"missing figure files: {missing}"


def _figure_pages(html_dir: Path, toc_pages: list[str]):
    return [check_page(html_dir, page.removesuffix(".html"), REPO_ROOT) for page in toc_pages]


def test_every_page_shows_every_figure_of_its_chapter(html_dir: Path,
                                                      toc_pages: list[str]) -> None:
    pages = _figure_pages(html_dir, toc_pages)
    problems = {p.page: p.problems for p in pages if p.problems}
    assert not problems, problems
    in_sources = sum(source_figure_cells(src) for src in (REPO_ROOT / "chapters").glob("*.md"))
    shown = sum(p.in_html for p in pages)
    selected = (html_dir.parent / "stage" / "_toc.yml").read_text() != \
        (REPO_ROOT / "_toc.yml").read_text()
    if not selected:  # the whole book: every figure cell of every chapter is on a page
        assert shown == in_sources >= MIN_FIGURES, (shown, in_sources)
    assert shown > 0
    print({p.page: p.in_html for p in pages if p.in_html}, "total", shown)


def test_every_figure_is_cited_from_the_prose(html_dir: Path, toc_pages: list[str]) -> None:
    cited = links_in_book(html_dir, toc_pages)
    ids = [i for p in _figure_pages(html_dir, toc_pages) for i in p.ids]
    assert ids
    assert len(set(ids)) == len(ids), "duplicate figure labels"
    uncited = [i for i in ids if i not in cited]
    assert not uncited, f"figures no page cites with {{numref}}: {uncited}"


def test_figure_check_fails_on_a_missing_blank_or_blurred_figure(html_dir: Path,
                                                                  tmp_path: Path,
                                                                  toc_pages: list[str]) -> None:
    """The check itself: break one page's figure three ways and see each reported."""
    page = next(p for p in _figure_pages(html_dir, toc_pages) if p.in_html)
    doc = page.page.removesuffix(".html")
    site = tmp_path / "html"
    shutil.copytree(html_dir, site)
    shutil.copytree(html_dir.parent / "stage", tmp_path / "stage")
    path = site / page.page
    html = path.read_text()
    img = re.search(r'<img [^>]*src="([^"]+\.png)"[^>]*>', html)
    assert img, f"no PNG on {page.page}"
    png = (path.parent / img.group(1)).resolve()

    from PIL import Image

    Image.new("RGB", (1240, 860), "white").save(png)  # blank
    assert any("blank" in p for p in check_page(site, doc, REPO_ROOT).problems)
    Image.effect_noise((300, 200), 64).convert("RGB").save(png)  # too few pixels
    assert any("not sharp" in p for p in check_page(site, doc, REPO_ROOT).problems)
    path.write_text(html.replace(img.group(0), "", 1))  # figure removed from the page
    problems = check_page(site, doc, REPO_ROOT).problems
    assert any("images on the page" in p for p in problems), problems


def test_pages_load_nothing_from_other_hosts(html_dir: Path, toc_pages: list[str]) -> None:
    external = []
    for page in toc_pages:
        refs = _refs(html_dir / page)
        for url in refs.scripts + refs.styles:
            if re.match(r"^(https?:)?//", url):
                external.append(f"{page}: {url}")
    assert not external, f"scripts or styles from another host: {external}"


def test_mathjax_is_served_locally(html_dir: Path, toc_pages: list[str]) -> None:
    scripts = _refs(html_dir / toc_pages[0]).scripts
    mathjax = [s for s in scripts if "tex-chtml" in s or "mathjax" in s.lower()]
    assert mathjax, "no MathJax script on the root page"
    for src in mathjax:
        assert not re.match(r"^(https?:)?//", src), src
        assert (html_dir / src.split("?")[0]).exists(), f"MathJax file missing: {src}"


def test_each_notebook_page_offers_its_executed_notebook(html_dir: Path) -> None:
    sources = list((html_dir / "_sources").rglob("*.ipynb"))
    assert sources, "no executed notebook copied to _sources"
    for nb in sources:
        page = html_dir / nb.relative_to(html_dir / "_sources").with_suffix(".html")
        assert page.exists(), page
        assert f"_sources/{nb.relative_to(html_dir / '_sources').as_posix()}" in page.read_text()


def test_glued_values_are_resolved(html_dir: Path, toc_pages: list[str]) -> None:
    # an unresolved {glue:text} role leaves its source text or a warning box in the page
    bad = [p for p in toc_pages if "glue:text" in (html_dir / p).read_text()]
    assert not bad, f"unresolved glue roles in {bad}"


#: A parameters cell as the page shows it: ``quick = ...`` highlighted as code.
_SHOWN_QUICK = re.compile(r'<span class="n">quick</span>\s*<span class="o">=</span>')


def test_parameters_cells_show_only_where_the_page_uses_them(html_dir: Path,
                                                             toc_pages: list[str]) -> None:
    """The intro, the ledger and the reproducing page ignore ``quick``: their parameters cell
    is hidden; a chapter's stays in view (it lists what a reader can change)."""
    unused = ["intro.html", "chapters/claims_ledger.html", "chapters/reproducing.html"]
    assert set(unused) <= set(toc_pages)
    shown = [page for page in unused if _SHOWN_QUICK.search((html_dir / page).read_text())]
    assert not shown, f"a parameters cell that does nothing opens {shown}"
    chapters = [p for p in toc_pages if re.match(r"chapters/\d\d_", p)]
    assert len(chapters) >= 11 and all(
        _SHOWN_QUICK.search((html_dir / page).read_text()) for page in chapters)
