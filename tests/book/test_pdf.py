"""The PDF build (grpo_companion.book.pdf): its pure-Python parts always; the built PDF
itself (marker ``book``) when one exists.

The PDF check reads ``GRPO_BOOK_PDF`` (a PDF file) or else ``_build/pdf/book.pdf``, and is
skipped when there is none and the variable is unset: building it needs XeLaTeX (``make pdf``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from grpo_companion.book import pdf
from grpo_companion.book.pipeline import (
    REPO_ROOT,
    UsageError,
    is_notebook_source,
    source_path,
    toc_documents,
)
from grpo_companion.cli import build_parser

#: the full book set in XeLaTeX is 226 pages (2026-12-04); a PDF that lost its chapters'
#: content (outputs, figures) or whole chapters is far shorter
MIN_PAGES = 150


def test_pdf_config_lays_the_latex_settings_over_the_book_config(tmp_path) -> None:
    book = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    before = yaml.safe_dump(book)
    config = pdf.pdf_config(book, tmp_path / "bbm.sty")
    assert yaml.safe_dump(book) == before  # the argument is left alone
    assert config["latex"]["latex_engine"] == "xelatex"
    assert config["latex"]["use_jupyterbook_latex"] is True
    assert config["latex"]["latex_documents"]["targetname"] == "book.tex"
    assert config["latex"]["latex_documents"]["author"] == pdf.PDF_AUTHOR
    assert config["sphinx"]["extra_extensions"][-1] == "grpo_companion.book.pdf"
    assert config["sphinx"]["extra_extensions"][:-1] == book["sphinx"]["extra_extensions"]
    assert config["sphinx"]["config"]["latex_additional_files"] == [str(tmp_path / "bbm.sty")]
    assert config["sphinx"]["config"]["numfig"] is True  # the rest kept
    with pytest.raises(ValueError, match="latex"):
        pdf.pdf_config({"latex": "xelatex"}, tmp_path / "bbm.sty")


def test_write_pdf_config(tmp_path) -> None:
    stage = tmp_path / "stage"
    stage.mkdir()
    shutil.copy(REPO_ROOT / "_config.yml", stage / "_config.yml")
    path = pdf.write_pdf_config(stage, tmp_path)
    assert yaml.safe_load(path.read_text())["latex"]["latex_engine"] == "xelatex"
    standin = (tmp_path / "bbm.sty").read_text()
    assert r"\ProvidesPackage{bbm}" in standin and r"\providecommand{\mathbbm}" in standin


def test_column_widths() -> None:
    assert pdf.column_widths([["a", "bb"], ["ccc", "x" * 100]]) == [pdf.MIN_COLUMN,
                                                                     pdf.MAX_COLUMN]
    assert pdf.column_widths([["a" * 10, "b" * 20]]) == [10, 20]
    with pytest.raises(ValueError, match="rows"):
        pdf.column_widths([])
    with pytest.raises(ValueError, match="rows"):
        pdf.column_widths([["a", "b"], ["c"]])


def test_jupyter_book_command(tmp_path) -> None:
    cmd = pdf.jupyter_book_command(tmp_path / "stage", tmp_path / "pdf", tmp_path / "c.yml")
    assert cmd[1:5] == ["build", str(tmp_path / "stage"), "--builder", "pdflatex"]
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "c.yml")
    assert cmd[cmd.index("--path-output") + 1] == str(tmp_path / "pdf")
    assert "-n" in cmd
    env = pdf.latex_environment({"PATH": "/bin"})
    assert env["LATEXOPTS"] == "-interaction=nonstopmode -halt-on-error"
    assert env["PATH"] == "/bin"


def test_stage_from_build(tmp_path) -> None:
    with pytest.raises(UsageError, match="no staged book"):
        pdf.stage_from_build(tmp_path / "nothing", tmp_path / "stage")
    built = tmp_path / "built" / "stage"
    (built / "chapters").mkdir(parents=True)
    (built / "_toc.yml").write_text("root: intro\n")
    (built / "chapters" / "a.ipynb").write_text("{}")
    (built / ".confgen").mkdir()
    (built / ".confgen" / "conf.py").write_text("")
    assert pdf.stage_from_build(tmp_path / "built", tmp_path / "stage") == 2
    assert (tmp_path / "stage" / "chapters" / "a.ipynb").read_text() == "{}"
    assert not (tmp_path / "stage" / ".confgen").exists()


def test_missing_tex_is_one_usage_error(tmp_path, monkeypatch) -> None:
    assert pdf.missing_programs(("sh", "no-such-program-here")) == ["no-such-program-here"]
    monkeypatch.setattr(pdf, "missing_programs", lambda *_: ["xelatex"])
    from grpo_companion.book.pipeline import BuildOptions

    with pytest.raises(UsageError, match="xelatex.*make pdf"):
        pdf.build_pdf(BuildOptions(out=tmp_path))


def test_the_command_line_has_pdf() -> None:
    args = build_parser().parse_args(["pdf", "--from-build", "_build", "--out", "x"])
    assert args.command == "pdf" and args.from_build == Path("_build")


# ---------------------------------------------------------------------- the built PDF


def chapter_titles(docs: list[str], root: Path = REPO_ROOT) -> dict[str, str]:
    """The title (the first ``# `` heading of its source) of each of ``docs``."""
    titles = {}
    for doc in docs:
        src = source_path(root, doc)
        text = src.read_text()
        if is_notebook_source(src) and text.startswith("---"):
            text = text.split("---", 2)[2]
        match = re.search(r"^# (.+)$", text, re.MULTILINE)
        if match:
            titles[doc] = match[1].strip()
    return titles


def _squeeze(text: str) -> str:
    """Text without line-end hyphens, spaces, case or curly quotes: what survives LaTeX's line
    breaking and its typographic apostrophes (the paper's -> the paper’s)."""
    text = text.translate(str.maketrans("‘’“”", "''\"\""))
    return re.sub(r"\s+", "", re.sub(r"-\n", "", text)).lower()


@pytest.fixture(scope="module")
def book_pdf() -> Path:
    configured = os.environ.get("GRPO_BOOK_PDF")
    path = Path(configured) if configured else REPO_ROOT / "_build" / "pdf" / "book.pdf"
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.is_file():
        if configured:
            pytest.fail(f"GRPO_BOOK_PDF={configured}: no such file")
        pytest.skip("no PDF; run `make pdf` (needs XeLaTeX)")
    if shutil.which("pdftotext") is None or shutil.which("pdfinfo") is None:
        pytest.fail("pdftotext and pdfinfo (Debian: poppler-utils) are needed to read the PDF")
    return path


@pytest.mark.book
def test_the_pdf_has_many_pages(book_pdf: Path) -> None:
    info = subprocess.run(["pdfinfo", str(book_pdf)], capture_output=True, text=True,
                          check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.MULTILINE)[1])
    assert pages > MIN_PAGES, f"{book_pdf} has {pages} pages, expected more than {MIN_PAGES}"


@pytest.mark.book
def test_the_pdf_has_every_chapter_title(book_pdf: Path) -> None:
    text = _squeeze(subprocess.run(["pdftotext", str(book_pdf), "-"], capture_output=True,
                                   text=True, check=True).stdout)
    # the pages of the book this PDF was built from (<out>/stage beside <out>/pdf/book.pdf),
    # as conftest.toc_pages does for the HTML; else the repository's table of contents
    stage = book_pdf.parent.parent / "stage"
    docs = toc_documents(stage if (stage / "_toc.yml").is_file() else REPO_ROOT)
    titles = chapter_titles(docs)
    assert len(titles) == len(docs) > 15
    missing = [f"{doc}: {title!r}" for doc, title in titles.items()
               if _squeeze(title) not in text]
    assert not missing, f"titles not found in {book_pdf}: {missing}"


def test_bookmarks_lose_psdextra() -> None:
    config = {"latex_elements": {"preamble": "\\hypersetup{\n  pdfencoding=auto,\n  psdextra\n}"}}
    pdf._plain_bookmarks(None, config)
    assert config["latex_elements"]["preamble"] == ("\\hypersetup{\n  pdfencoding=auto\n}"
                                                    + pdf.BOOKMARK_MATH)


def test_tables_become_longtables_with_content_widths() -> None:
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.core import publish_doctree
    from sphinx.builders.latex import LaTeXBuilder

    doctree = publish_doctree("+----+--------------------------------+\n"
                              "| a  | a much longer cell of text     |\n"
                              "+----+--------------------------------+\n")
    latex = SimpleNamespace(builder=object.__new__(LaTeXBuilder))
    pdf._flow_tables(latex, doctree, "page")
    table = next(doctree.findall(nodes.table))
    assert {"longtable", "colwidths-given"} <= set(table["classes"])
    assert [spec["colwidth"] for spec in table.findall(nodes.colspec)] == [pdf.MIN_COLUMN, 26]
    html = publish_doctree("+---+\n| a |\n+---+\n")
    pdf._flow_tables(SimpleNamespace(builder=object()), html, "page")  # not LaTeX: untouched
    assert "longtable" not in next(html.findall(nodes.table))["classes"]


def _latex():
    from types import SimpleNamespace

    from sphinx.builders.latex import LaTeXBuilder

    return SimpleNamespace(builder=object.__new__(LaTeXBuilder))


def _cell(mode, output=True):
    from docutils import nodes

    cell = nodes.container(nb_element="cell_code", classes=["cell"])
    if mode:
        cell["hide_mode"] = mode
    cell += nodes.container("", nodes.literal_block("x = 1", "x = 1"),
                            nb_element="cell_code_source")
    if output:
        cell += nodes.container("", nodes.paragraph("", "out"), nb_element="cell_code_output")
    return cell


def test_folded_inputs_are_left_out_of_the_pdf() -> None:
    from docutils import nodes

    def build():
        page = nodes.section()
        page += [_cell(None), _cell("input"), _cell("input", output=False), _cell("all")]
        return page

    page = build()
    pdf._drop_folded_inputs(_latex(), page, "page")
    cells = [c for c in page.children if isinstance(c, nodes.container)]
    assert [[child["nb_element"] for child in c.children] for c in cells] == [
        ["cell_code_source", "cell_code_output"], ["cell_code_output"]]
    html = build()  # not LaTeX: untouched
    from types import SimpleNamespace
    pdf._drop_folded_inputs(SimpleNamespace(builder=object()), html, "page")
    assert len(html.children) == 4


def _page(titles):
    from docutils import nodes

    page = nodes.section()
    page += nodes.title("", "Errata")
    for title in titles:
        section = nodes.section()
        section += nodes.title("", title)
        page += section
    return page


def test_self_numbered_sections_lose_their_number_only_when_they_count_1_2_3() -> None:
    from docutils import nodes

    def titles(page):
        return [s[0].astext() for s in page.children if isinstance(s, nodes.section)]

    errata = _page(["1. A slip", "2. Another", "3. Third", "Summary"])
    pdf._unnumber_self_numbered_sections(_latex(), errata, "chapters/errata")
    assert titles(errata) == ["A slip", "Another", "Third", "Summary"]
    other = _page(["2. Starts at two", "3. Then three"])
    pdf._unnumber_self_numbered_sections(_latex(), other, "page")
    assert titles(other) == ["2. Starts at two", "3. Then three"]
