"""The built book's download notebooks read as plain Markdown (marker ``book``).

The download button of a chapter serves ``_sources/<doc>.ipynb``; the pipeline rewrites it
with :mod:`grpo_companion.book.export`. Here every chapter's file must be free of MyST markup,
keep every cell, and show each glued number exactly as the HTML page shows it (Sphinx's own
rendering is the independent reference). On the book built before the rewrite existed, the
markup test reported 641 glued roles and every chapter (run once to see it fail).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import nbformat
import pytest
from myst_nb.core.variables import format_plain_text

from grpo_companion.book.export import glued_values
from grpo_companion.book.pipeline import REPO_ROOT

pytestmark = pytest.mark.book

# a role (``{ref}`x` ``) or a directive's fence (```` ```{prf:theorem} ````); ``\mathrm{ref}`` in
# math is neither
MARKUP = re.compile(r"\{(?:glue(?::[a-z]+)?|prf:[a-z]+|numref|ref|doc|cite(?::[a-z]+)?|eq)\}`"
                    r"|^[`:]{3,}\{[a-z:-]+\}", re.MULTILINE)
GLUE_TEXT = re.compile(r"\{glue:text\}`([^`:]+)(?::([^`]*))?`")


def _chapters(html_dir: Path, toc_pages: list[str]) -> list[str]:
    docs = [page.removesuffix(".html") for page in toc_pages]
    return [d for d in docs if (html_dir / "_sources" / f"{d}.ipynb").exists()]


def _visible_text(page: Path) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.DOTALL)
    text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return text.translate(str.maketrans("‘’“”", "''\"\""))  # smart quotes


def test_download_notebooks_hold_no_myst_markup(html_dir: Path, toc_pages: list[str]) -> None:
    chapters = _chapters(html_dir, toc_pages)
    assert len(chapters) >= 12, chapters  # the intro, the 12 chapters, the ledger...
    offenders = {}
    for doc in chapters:
        nb = nbformat.read(html_dir / "_sources" / f"{doc}.ipynb", as_version=4)
        found = [m.group(0) for c in nb.cells if c.cell_type == "markdown"
                 for m in MARKUP.finditer(c.source)]
        if found:
            offenders[doc] = (len(found), sorted(set(found))[:5])
    assert not offenders, offenders


def test_download_notebooks_show_the_glued_numbers_of_the_page(
        html_dir: Path, toc_pages: list[str]) -> None:
    checked = 0
    for doc in _chapters(html_dir, toc_pages):
        source = (REPO_ROOT / f"{doc}.md").read_text()
        served = nbformat.read(html_dir / "_sources" / f"{doc}.ipynb", as_version=4)
        staged = nbformat.read(html_dir.parent / "stage" / f"{doc}.ipynb", as_version=4)
        captions = [c for c in served.cells
                    if "figure-caption" in c.metadata.get("tags", [])]
        assert len(served.cells) == len(staged.cells) + len(captions), doc
        markdown = "\n".join(c.source for c in served.cells if c.cell_type == "markdown")
        page = _visible_text(html_dir / f"{doc}.html")
        values = glued_values(staged)
        for name, spec in GLUE_TEXT.findall(source):
            if name not in values:  # a role inside a glued table, shown by glue:md
                continue
            shown = format_plain_text(values[name]["text/plain"], spec or "")
            assert shown in page, (doc, name, shown)  # what Sphinx rendered
            assert shown in markdown, (doc, name, shown)
            checked += 1
    assert checked >= 300, checked  # the book glues over 600 numbers into its prose


def test_download_notebooks_number_boxes_as_the_page(html_dir: Path,
                                                      toc_pages: list[str]) -> None:
    """Every exercise and theorem-like box is headed with the number its page shows."""
    boxes = 0
    for doc in _chapters(html_dir, toc_pages):
        source = (REPO_ROOT / f"{doc}.md").read_text()
        served = nbformat.read(html_dir / "_sources" / f"{doc}.ipynb", as_version=4)
        markdown = "\n".join(c.source for c in served.cells if c.cell_type == "markdown")
        page = _visible_text(html_dir / f"{doc}.html")
        for kind in ("exercise", "theorem", "definition", "proposition", "lemma"):
            wanted = len(re.findall(rf"^`{{3,}}\{{(?:prf:)?{kind}\}}", source, re.MULTILINE))
            shown = re.findall(rf"^> \*\*({kind.title()} \d+\.\d+)", markdown, re.MULTILINE)
            assert len(shown) == wanted, (doc, kind, wanted, shown)
            for heading in shown:
                assert heading in page, (doc, heading)
            boxes += wanted
    assert boxes >= 60, boxes  # 43 exercises and over 20 theorem-like boxes
