"""Static checks of the built HTML: every page exists, no errors, no missing figures,
nothing loaded from another host."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

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
