r"""The whole book as one PDF, through Jupyter Book 1's ``pdflatex`` builder.

The chapters are staged and executed exactly as for the HTML book
(:func:`grpo_companion.book.pipeline.stage_documents`: same cache, same kernel), or taken
from the staged tree of a book built before (``from_build``). Jupyter Book then renders the
staged tree to LaTeX (``jupyter-book build --builder pdflatex``) and runs ``latexmk`` on it,
with the settings of :func:`pdf_config` laid over ``_config.yml`` (:func:`write_pdf_config`).
Jupyter Book's ``sphinx-jupyterbook-latex`` stays on (the front page as front matter, the
toc's captions as parts, XeLaTeX with ``unicode-math``, which typesets Ω, β and é in text and
in math). Its ``jupyterBook`` class loads ``bbm.sty``, which Debian ships only in the
500 MB ``texlive-fonts-extra``, for shortcuts such as ``\RR`` that the book never uses: the
build puts a stand-in ``bbm.sty`` beside the LaTeX (:data:`BBM_STANDIN`, ``\mathbbm`` drawn as
``\mathbb``). This module is also added as a Sphinx extension (:func:`setup`) that

- sets every table as a ``longtable`` with wrapping columns whose widths follow their
  content (:func:`column_widths`), so that a long table breaks across pages and a wide one
  wraps instead of running off the page;
- leaves out the input of the cells that the HTML folds (``_drop_folded_inputs``);
- numbers the errata's items once (``_unnumber_self_numbered_sections``).

The LaTeX toolchain is not a Python package: ``scripts/tex_packages.txt`` lists the Debian
packages it needs and ``scripts/install_tex.py`` installs them.

The result is ``<out>/pdf/book.pdf``; the LaTeX sources and logs stay in
``<out>/pdf/_build/latex``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpo_companion.book.pipeline import (
    BookBuildError,
    BuildOptions,
    UsageError,
    build_lock,
    copy_if_changed,
    stage_documents,
    write_if_changed,
)

#: the programs a PDF build runs, besides Python's
TEX_PROGRAMS = ("xelatex", "latexmk", "make")
#: the file ``latex_documents.targetname`` of ``_config.yml`` names
PDF_NAME = "book.pdf"
#: laid over the ``latex`` section of ``_config.yml`` for the PDF (see the module's docstring)
LATEX_SETTINGS = {"latex_engine": "xelatex", "use_jupyterbook_latex": True}
#: the title page's author line, broken where the one-line author of ``_config.yml`` would
#: run off the page (LaTeX markup, as Sphinx's ``latex_documents`` takes it)
PDF_AUTHOR = (r"grpo-companion contributors\\on the paper by Youssef Mroueh\\"
              "(arXiv 2503.06639, ICML 2026)")
#: ``bbm.sty`` for the build (see the module's docstring)
BBM_STANDIN = r"""\NeedsTeXFormat{LaTeX2e}
\ProvidesPackage{bbm}[2026/12/04 grpo-companion stand-in, mathbbm drawn as mathbb]
\RequirePackage{amssymb}
\providecommand{\mathbbm}[1]{\mathbb{#1}}
"""
#: the shortest and longest column width counted in characters (:func:`column_widths`)
MIN_COLUMN, MAX_COLUMN = 6, 60


@dataclass(frozen=True)
class PdfResult:
    """What a PDF build produced.

    Parameters
    ----------
    pdf : the PDF file, ``<out>/pdf/book.pdf``.
    seconds : wall-clock time of the whole build (staging included).
    latex_seconds : of which Sphinx's LaTeX writer and ``latexmk``.
    """

    pdf: Path
    seconds: float
    latex_seconds: float


def missing_programs(programs: tuple[str, ...] = TEX_PROGRAMS) -> list[str]:
    """The programs of ``programs`` that are not on the ``PATH``."""
    return [name for name in programs if shutil.which(name) is None]


def pdf_folder(out: Path) -> Path:
    """Where a PDF build into ``out`` writes: ``<out>/pdf``."""
    return Path(out) / "pdf"


def stage_from_build(built: Path, stage: Path) -> int:
    """Copy the staged tree of an earlier build (``<built>/stage``) into ``stage``.

    The earlier build's executed notebooks are used as they are, so nothing is executed;
    ``built`` is only read. Returns the number of files copied or already identical.
    Raises :class:`~grpo_companion.book.pipeline.UsageError` when ``<built>/stage`` holds
    no staged book (no ``_toc.yml``).
    """
    source = Path(built) / "stage"
    if not (source / "_toc.yml").is_file():
        raise UsageError(f"--from-build {built}: {source} holds no staged book (no _toc.yml); "
                         "build the book there first (python -m grpo_companion book --out "
                         f"{built})")
    count = 0
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_file() and not path.is_symlink() and ".confgen" not in relative.parts:
            copy_if_changed(path, stage / relative)
            count += 1
    return count


def pdf_config(book_config: dict, bbm: Path) -> dict:
    """``book_config`` (a parsed ``_config.yml``) for the PDF: :data:`LATEX_SETTINGS` and
    :data:`PDF_AUTHOR` in its ``latex`` section, the file ``bbm`` (:data:`BBM_STANDIN`)
    copied beside the LaTeX, and this module as a Sphinx extension. The argument is not
    modified."""
    config = copy.deepcopy(book_config)
    latex = config.get("latex") or {}
    if not isinstance(latex, dict):
        raise ValueError(f"book_config: its 'latex' section must be a mapping, got {latex!r}")
    documents = {**(latex.get("latex_documents") or {}), "author": PDF_AUTHOR}
    config["latex"] = {**latex, **LATEX_SETTINGS, "latex_documents": documents}
    sphinx = config.setdefault("sphinx", {})
    sphinx["config"] = {**(sphinx.get("config") or {}), "latex_additional_files": [str(bbm)]}
    extensions = list(sphinx.get("extra_extensions") or [])
    if __name__ not in extensions:
        extensions.append(__name__)
    sphinx["extra_extensions"] = extensions
    return config


def column_widths(rows: list[list[str]]) -> list[int]:
    """Relative widths of a table's columns: the longest text of each column, in characters,
    clipped to [:data:`MIN_COLUMN`, :data:`MAX_COLUMN`].

    Parameters
    ----------
    rows : the text of every cell, one list per row, all of one length (header rows too).
    """
    if not rows or not rows[0]:
        raise ValueError("rows: a table needs at least one row and one column")
    if any(len(row) != len(rows[0]) for row in rows):
        raise ValueError(f"rows: every row must have {len(rows[0])} cells, as the first has")
    return [min(MAX_COLUMN, max(MIN_COLUMN, *(len(row[i]) for row in rows)))
            for i in range(len(rows[0]))]


def _flow_tables(app, doctree, docname) -> None:
    """``doctree-resolved`` for LaTeX: every table a ``longtable`` with content-sized,
    wrapping columns (see :func:`column_widths`)."""
    from docutils import nodes
    from sphinx.builders.latex import LaTeXBuilder

    if not isinstance(app.builder, LaTeXBuilder):
        return
    for table in doctree.findall(nodes.table):
        for group in table.findall(nodes.tgroup):
            specs = [n for n in group.children if isinstance(n, nodes.colspec)]
            rows = [[entry.astext() for entry in row.findall(nodes.entry)]
                    for row in group.findall(nodes.row)]
            rows = [row for row in rows if len(row) == len(specs)]  # no spanning cells
            if not specs or not rows:
                continue
            for spec, width in zip(specs, column_widths(rows), strict=True):
                spec["colwidth"] = width
        table["classes"] = [c for c in table["classes"] if c != "colwidths-auto"]
        table["classes"] += [c for c in ("longtable", "colwidths-given")
                             if c not in table["classes"]]


def _drop_folded_inputs(app, doctree, docname) -> None:
    """``doctree-resolved`` for LaTeX: a page cannot be unfolded on paper, so a code cell whose
    input the HTML folds (``hide-input``: the checks, the bookkeeping, the parameters cell)
    keeps only its output, and a folded cell (``hide-cell``) is left out. A cell with nothing
    left is removed."""
    from docutils import nodes
    from sphinx.builders.latex import LaTeXBuilder

    if not isinstance(app.builder, LaTeXBuilder):
        return
    for cell in list(doctree.findall(nodes.container)):
        mode = cell.get("hide_mode")
        if cell.get("nb_element") != "cell_code" or mode is None or cell.parent is None:
            continue
        if mode in ("input", "input+output"):
            for child in list(cell.children):
                if isinstance(child, nodes.Element) and \
                        child.get("nb_element") == "cell_code_source":
                    cell.remove(child)
        if mode == "all" or not any(isinstance(c, nodes.Element) for c in cell.children):
            cell.parent.remove(cell)


#: a heading numbered in its own text ("3. Theorem 8 drops ...", the errata's items), which
#: LaTeX would number a second time ("17.3 3. Theorem 8 ...")
SELF_NUMBERED = re.compile(r"^(\d+)\.\s+")


def _unnumber_self_numbered_sections(app, doctree, docname) -> None:
    """``doctree-resolved`` for LaTeX: a page whose top sections all carry their own number
    1, 2, 3... in order (the errata) loses that prefix, so the PDF's section number (the
    chapter's, then the same 1, 2, 3...) is the only one. Pages with any other numbering are
    left as they are."""
    from docutils import nodes
    from sphinx.builders.latex import LaTeXBuilder

    if not isinstance(app.builder, LaTeXBuilder):
        return
    for top in doctree.findall(nodes.section):
        sections = [s for s in top.children if isinstance(s, nodes.section)]
        numbered = [s for s in sections if SELF_NUMBERED.match(s[0].astext())]
        if len(numbered) < 2 or numbered != sections[:len(numbered)] or [
                int(SELF_NUMBERED.match(s[0].astext())[1]) for s in numbered
        ] != list(range(1, len(numbered) + 1)):
            continue
        for section in numbered:
            title = section[0]
            first = next(title.findall(nodes.Text), None)
            if first is not None and SELF_NUMBERED.match(str(first)):
                first.parent.replace(first, nodes.Text(SELF_NUMBERED.sub("", str(first), 1)))


#: the math of a heading (Sphinx writes ``\protect\(...\protect\)``) goes into the PDF outline
#: as its TeX source: expanding it there under ``unicode-math`` stops XeLaTeX at the first
#: Greek letter ("Improper alphabetic constant", ``\mitbeta``), as in the errata's headings
BOOKMARK_MATH = "\n\\pdfstringdefDisableCommands{\\def\\(#1\\protect\\){\\detokenize{#1}}}\n"


def _plain_bookmarks(app, config) -> None:
    """``config-inited``, after ``sphinx-jupyterbook-latex``'s: drop the ``psdextra`` option it
    gives hyperref and add :data:`BOOKMARK_MATH`, so that the outline (bookmarks) never
    expands a heading's math."""
    elements = config["latex_elements"]
    preamble = re.sub(r",\s*psdextra\b", "", elements.get("preamble", ""))
    elements["preamble"] = preamble + BOOKMARK_MATH


def setup(app) -> dict:
    """Sphinx extension for the PDF build (added by :func:`pdf_config`)."""
    app.connect("config-inited", _plain_bookmarks, priority=900)
    app.connect("doctree-resolved", _flow_tables)
    app.connect("doctree-resolved", _drop_folded_inputs)
    app.connect("doctree-resolved", _unnumber_self_numbered_sections)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def write_pdf_config(stage: Path, folder: Path) -> Path:
    """Write :func:`pdf_config` of ``<stage>/_config.yml`` to ``<folder>/_config.yml`` and
    :data:`BBM_STANDIN` to ``<folder>/bbm.sty``."""
    bbm = folder / "bbm.sty"
    write_if_changed(bbm, BBM_STANDIN.encode())
    config = pdf_config(yaml.safe_load((stage / "_config.yml").read_text()) or {}, bbm)
    path = folder / "_config.yml"
    write_if_changed(path, yaml.safe_dump(config, sort_keys=False, allow_unicode=True).encode())
    return path


def jupyter_book_command(stage: Path, output: Path, config: Path) -> list[str]:
    """The ``jupyter-book build`` command line that renders ``stage`` with ``config`` to a
    PDF under ``<output>/_build/latex`` (nitpicky; Jupyter Book then runs ``make all-pdf``)."""
    exe = Path(sys.executable).parent / "jupyter-book"
    return [str(exe) if exe.exists() else "jupyter-book", "build", str(stage),
            "--builder", "pdflatex", "--path-output", str(output), "--config", str(config),
            "-n", "--all"]


def latex_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ``latexmk``: TeX stops at the first error instead of waiting
    for an answer on the terminal (``LATEXOPTS``, which Sphinx's ``latexmkrc`` passes on)."""
    env = dict(os.environ if base is None else base)
    env["LATEXOPTS"] = "-interaction=nonstopmode -halt-on-error"
    return env


def build_pdf(opts: BuildOptions, from_build: Path | None = None, log=print) -> PdfResult:
    """Stage (and execute, cached) every page, then render the book to ``<out>/pdf/book.pdf``.

    Parameters
    ----------
    opts : what to build and where (:class:`~grpo_companion.book.pipeline.BuildOptions`);
        the staged tree is ``opts.stage``, the PDF lands in ``<opts.out>/pdf``.
    from_build : if given, a build folder (such as ``_build``) whose staged, executed tree
        is copied instead of staging and executing the chapters again; it must not be
        ``opts.out`` itself.
    log : where progress lines go.

    Raises
    ------
    UsageError
        XeLaTeX, latexmk or make is missing (the message says how to install them), or
        ``from_build`` holds no staged book.
    BookBuildError
        A chapter fails, or Jupyter Book or LaTeX fails (the LaTeX log is named).
    """
    missing = missing_programs()
    if missing:
        raise UsageError(f"the PDF needs {', '.join(missing)}: run `make pdf`, which installs "
                         "them (scripts/install_tex.py), or install the Debian packages of "
                         "scripts/tex_packages.txt")
    if from_build is not None and Path(from_build).resolve() == Path(opts.out).resolve():
        raise UsageError("--from-build must name another build folder than --out")
    t0 = time.perf_counter()
    folder = pdf_folder(opts.out)
    with build_lock(opts.out):
        if from_build is None:
            log(f"== staging and executing notebooks into {opts.stage}")
            stage_documents(opts, log=log)
        else:
            log(f"== staging the executed book of {from_build} into {opts.stage}")
            count = stage_from_build(Path(from_build), opts.stage)
            log(f"   {count} files")
        log("== rendering LaTeX and the PDF (jupyter-book build --builder pdflatex)")
        t1 = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        config = write_pdf_config(opts.stage, folder)
        proc = subprocess.run(jupyter_book_command(opts.stage, folder, config),
                              env=latex_environment(), stdin=subprocess.DEVNULL)
        latex_dir = folder / "_build" / "latex"
        built = latex_dir / PDF_NAME
        if proc.returncode or not built.is_file():
            logs = sorted(latex_dir.glob("*.log"))
            where = f"; see {logs[0]}" if logs else ""
            raise BookBuildError(f"the PDF build failed (exit {proc.returncode}){where}")
        target = folder / PDF_NAME
        shutil.copyfile(built, target)
        latex_seconds = time.perf_counter() - t1
    seconds = time.perf_counter() - t0
    log(f"== PDF ready: {target} ({target.stat().st_size / 1e6:.1f} MB, {seconds:.0f} s)")
    return PdfResult(target, seconds, latex_seconds)
