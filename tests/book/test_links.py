"""Links out of the built book and across it (marker ``book``): the paper's and the repository's
links in every page's header, the bibliography's author-year labels and URLs, the errata items
and the ledger's pages as links whose targets exist, and the index of the paper's results."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import pytest
from bs4 import BeautifulSoup

from grpo_companion.book import links

pytestmark = pytest.mark.book

# the paper's two addresses, from the paper's own pages (arXiv identifier and PMLR volume)
ARXIV = "https://arxiv.org/abs/2503.06639"
PMLR = "https://proceedings.mlr.press/v306/mroueh26a.html"
#: a mention of an errata item in running text, the form the chapters use
ERRATA_MENTION = re.compile(r"\b(?:[Ii]tems? \d+(?:(?:, | and )\d+)* of the errata"
                            r"|errata,? items? \d+)")


def _soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(), "html.parser")


def _repository(html_dir: Path) -> str | None:
    """The repository the header should link (None: the build had no address for one)."""
    options = _theme_options(html_dir)
    return options.get("repository_url") if options.get("use_repository_button") else None


def _theme_options(html_dir: Path) -> dict:
    """The html_theme_options Sphinx built with (the staged conf.py beside the HTML)."""
    conf = html_dir.parent / "stage" / "conf.py"
    for node in ast.parse(conf.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == \
                "html_theme_options":
            return ast.literal_eval(node.value)
    return {}


def _header_links(page: BeautifulSoup) -> set[str]:
    header = page.select_one(".bd-header-article")
    return {a["href"] for a in header.find_all("a", href=True)} if header else set()


def _exists(html_dir: Path, page: Path, href: str) -> bool:
    """True when an internal link's file exists and, with a fragment, holds that id."""
    target, fragment = urldefrag(urljoin(page.relative_to(html_dir).as_posix(), href))
    path = html_dir / target
    if not path.is_file():
        return False
    return not fragment or _soup(path).find(id=fragment) is not None


def test_every_page_header_links_the_paper_and_the_repository(html_dir, toc_pages):
    repository = _repository(html_dir)
    missing = {}
    for name in toc_pages:
        found = _header_links(_soup(html_dir / name))
        wanted = {ARXIV, PMLR} | ({repository} if repository else set())
        if wanted - found:
            missing[name] = sorted(wanted - found)
    assert len(toc_pages) >= 5
    assert not missing, f"header links missing: {missing}"


def test_the_repository_button_is_there_only_with_an_address(html_dir, toc_pages):
    repository = _repository(html_dir)
    page = _soup(html_dir / toc_pages[0])
    buttons = page.select(".bd-header-article a.btn-source-repository-button, "
                          ".bd-header-article [aria-label='Source repositories'] a")
    if repository:
        assert [b["href"] for b in buttons] == [repository]
    else:
        assert buttons == []


def test_every_chapter_has_a_binder_launch_button_with_an_address(html_dir, toc_pages):
    """With a repository address, every executed chapter's header opens its MyST source on
    Binder in JupyterLab (binder/ sets up the environment); without one, no page has a
    launch link (sphinx-book-theme needs the address to build it)."""
    repository = _repository(html_dir)
    options = _theme_options(html_dir)
    chapters = [name for name in toc_pages if name.startswith("chapters/")]
    assert len(chapters) >= 12
    found = {}
    for name in chapters:
        page = _soup(html_dir / name)
        found[name] = [a["href"] for a in page.select(".bd-header-article a[href]")
                       if a["href"].startswith("https://mybinder.org/")]
    if not repository:
        assert not any(found.values()), f"launch links without an address: {found}"
        return
    host, owner_repo = repository.split("://", 1)[1].split("/", 1)
    branch = options.get("repository_branch", "main")
    # mybinder.org's address of a GitHub repository; any other host goes by its full URL
    start = (f"https://mybinder.org/v2/gh/{owner_repo}/{branch}" if host == "github.com"
             else "https://mybinder.org/v2/git/")
    wrong = {}
    for name, hrefs in found.items():
        wanted = f"?urlpath=lab/tree/{name.removesuffix('.html')}.md"
        if len(hrefs) != 1 or not (hrefs[0].startswith(start) and hrefs[0].endswith(wanted)):
            wrong[name] = hrefs
    assert not wrong, f"chapters whose Binder link is missing or wrong: {wrong}"


def test_bibliography_labels_are_author_year_and_every_entry_links_out(html_dir):
    page = _soup(html_dir / "bibliography.html")
    entries = page.select("div.citation")
    assert len(entries) >= 3
    assert "author-year labels" in page.get_text()
    for entry in entries:
        label = entry.select_one(".label").get_text().strip("[] ")
        assert re.fullmatch(r"(von )?[A-Z][a-z]+( and [A-Z][a-z]+| et al\.)? \d{4}[a-z]?",
                            label), f"not an author-year label: {label!r}"
        hrefs = [a["href"] for a in entry.find_all("a", href=True)]
        assert any(h.startswith(("https://arxiv.org/abs/", "https://doi.org/",
                                 "https://proceedings.mlr.press/", "https://github.com/"))
                   for h in hrefs), f"{label}: no URL or DOI ({hrefs})"
    text = page.get_text()
    assert "Mroueh 2026" in text and ARXIV in " ".join(
        a["href"] for a in page.find_all("a", href=True))


def test_errata_mentions_are_links_to_existing_items(html_dir, toc_pages):
    linked, plain = [], {}
    for name in toc_pages:
        path = html_dir / name
        article = _soup(path).select_one("article")
        if article is None:
            continue
        for a in article.find_all("a", href=re.compile(r"errata\.html#errata-item-\d+$")):
            assert _exists(html_dir, path, a["href"]), f"{name}: {a['href']} has no target"
            linked.append((name, a["href"]))
        for element in article.find_all(["a", "code", "pre"]):
            element.decompose()  # what is left is prose that is not a link
        mentions = ERRATA_MENTION.findall(" ".join(article.get_text(" ").split()))
        if mentions:
            plain[name] = mentions
    assert not plain, f"errata items mentioned as plain text: {plain}"
    assert len(linked) >= 2, linked


def test_the_ledger_links_each_page_that_checked_a_claim(html_dir):
    path = html_dir / "chapters" / "claims_ledger.html"
    tables = _soup(path).select("table.claims-ledger")
    assert tables, "no table of class claims-ledger"
    rows = [tr for table in tables for tr in table.select("tbody tr")]
    assert len(rows) >= 40
    checked = 0
    for tr in rows:
        cells = tr.find_all("td")
        assert len(cells) == 5
        if not cells[3].get_text(strip=True):
            continue  # not checked by any page of this build
        checked += 1
        hrefs = [a["href"] for a in cells[3].find_all("a", href=True)]
        assert hrefs, f"'checked in' is plain text: {cells[3].get_text()!r}"
        for href in hrefs:
            assert _exists(html_dir, path, href), f"{href} has no target"
    assert checked >= 1


def test_the_paper_index_maps_every_result(html_dir):
    path = html_dir / "chapters" / "paper_index.html"
    assert path.exists(), "the book has no index of the paper's results"
    rows = [tr.find_all("td") for tr in _soup(path).select("article table tbody tr")]
    by_result = {cells[0].get_text(strip=True): cells[1] for cells in rows}
    assert set(links.PAPER_RESULTS) <= set(by_result)
    for result in links.PAPER_RESULTS:
        cell = by_result[result]
        text = cell.get_text(" ", strip=True)
        hrefs = [a["href"] for a in cell.find_all("a", href=True)]
        assert hrefs or "not restated" in text, f"{result}: {text!r}"
        for href in hrefs:
            assert _exists(html_dir, path, href), f"{result}: {href} has no target"
    boxed = [r for r in links.PAPER_RESULTS if by_result[r].find("a", href=True)]
    assert len(boxed) >= 1
