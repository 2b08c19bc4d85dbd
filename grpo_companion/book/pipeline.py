"""Build the executed book: jupytext -> papermill (cached) -> jupyter-book (Sphinx).

The sources stay untouched. Every page listed in ``_toc.yml`` is staged into
``<out>/stage``: plain MyST pages are copied, MyST-markdown notebooks (files with
jupytext front matter) are converted to ``.ipynb`` and executed by papermill in
the staged copy of their folder. An executed notebook is cached under
``<out>/cache`` with a key made of the notebook text, the parameters, the
library's source and the kernel's environment and packages, so that an
unchanged chapter is not run again while any edit to ``grpo_companion``
re-executes every chapter. Every kernel runs in an environment the pipeline
owns (:mod:`grpo_companion.book.kernel`), whatever the caller's shell sets, and every figure a cell
draws must come out as a numbered, captioned image (:func:`check_figures`). Sphinx
then renders the staged tree with execution off and ``-n -W --keep-going``, so
that a broken reference, a missing citation or a bad option fails the build.

The staged tree is only rewritten where content changed, so that Sphinx's
incremental build (keyed on file modification times) stays warm. Every file is
written atomically (:func:`grpo_companion.files.atomic_write`: an unpredictable temporary
beside it, then ``os.replace``),
each cached notebook carries a SHA-256 checksum of its bytes (a ``.sha256``
sidecar written with it; a notebook that no longer matches is executed again),
and one build at a time holds ``<out>/.build.lock`` (:func:`build_lock`).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import fcntl
import hashlib
import json
import keyword
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat
import yaml

from grpo_companion.book.export import export_reader_notebooks
from grpo_companion.book.kernel import kernel_digest, kernel_session
from grpo_companion.book.parameters import check_value
from grpo_companion.files import (  # the book's writers (defined here before; still importable)
    atomic_write,
    copy_if_changed,
    remove_stale_temporaries,  # noqa: F401
    sweep_stale_temporaries,
    write_if_changed,
)
from grpo_companion.plotting import TEXT_RECORD_KEY

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_DIR.parent
KERNEL_NAME = "python3"
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
BOOK_FILES = ("_config.yml", "_toc.yml", "references.bib")
MATHJAX_DIRNAME = "mathjax"
LOCK_NAME = ".build.lock"
CHECKSUM_SUFFIX = ".sha256"


class BookBuildError(RuntimeError):
    """A chapter failed to execute or Sphinx reported errors."""


class UsageError(BookBuildError):
    """The caller asked for something that cannot be done: a missing or invalid
    chapter source, an unknown parameter or one of the wrong type, a selection
    that matches nothing. The command line reports it with exit status 2."""


@dataclass(frozen=True)
class BuildOptions:
    """What to build and where.

    Parameters
    ----------
    root : repository root holding ``_config.yml`` and ``_toc.yml``.
    out : build directory; the HTML lands in ``out / "html"``.
    quick : passed to every notebook as the ``quick`` parameter.
    parameters : further papermill parameters passed to every notebook.
    cell_timeout : seconds a single cell may run before the build fails.
    select : if given, build a partial book: the root page, the plain pages and
        only those notebooks whose name contains one of these strings (for
        previewing a chapter quickly; references to left-out pages are shown as plain
        text, and only they are allowed to be unresolved).
    """

    root: Path = REPO_ROOT
    out: Path = REPO_ROOT / "_build"
    quick: bool = False
    parameters: Mapping[str, object] = field(default_factory=dict)
    cell_timeout: int = 900
    select: tuple[str, ...] = ()

    @property
    def stage(self) -> Path:
        return self.out / "stage"

    @property
    def cache(self) -> Path:
        return self.out / "cache"

    @property
    def html(self) -> Path:
        return self.out / "html"

    def notebook_parameters(self) -> dict[str, object]:
        return {"quick": bool(self.quick), **dict(self.parameters)}


# --------------------------------------------------------------------------- toc


def toc_documents(root: Path) -> list[str]:
    """Every document named in ``_toc.yml`` (root first), without extension."""
    return documents_of(yaml.safe_load((root / "_toc.yml").read_text()))


def documents_of(toc: Mapping) -> list[str]:
    """Every document of a parsed table of contents (root first)."""
    docs = [toc["root"]]

    def walk(entries: Iterable[Mapping]) -> None:
        for entry in entries:
            if "file" in entry:
                docs.append(entry["file"])
            for key in ("parts", "chapters", "sections"):
                if key in entry:
                    walk(entry[key])

    walk(toc.get("parts", []) + toc.get("chapters", []))
    return docs


def select_toc(toc: Mapping, keep) -> dict:
    """A copy of ``toc`` without the entries for which ``keep(file)`` is false
    (and without parts left empty)."""

    def prune(entries: list[Mapping]) -> list[dict]:
        out = []
        for entry in entries:
            entry = dict(entry)
            if "file" in entry and not keep(entry["file"]):
                continue
            for key in ("parts", "chapters", "sections"):
                if key in entry:
                    entry[key] = prune(entry[key])
                    if not entry[key]:
                        del entry[key]
            if "file" in entry or any(k in entry for k in ("chapters", "sections", "parts")):
                out.append(entry)
        return out

    toc = dict(toc)
    for key in ("parts", "chapters"):
        if key in toc:
            toc[key] = prune(toc[key])
    return toc


def source_path(root: Path, doc: str) -> Path:
    """The source file of a toc entry (``.md`` or ``.ipynb``)."""
    for suffix in (".md", ".ipynb"):
        path = root / f"{doc}{suffix}"
        if path.exists():
            return path
    raise BookBuildError(f"_toc.yml names {doc!r} but neither {doc}.md nor {doc}.ipynb exists")


def _front_matter(path: Path) -> dict:
    text = path.read_text()
    if not text.startswith("---"):
        return {}
    parts = text.split("---", 2)
    if len(parts) < 3:
        raise UsageError(f"{path}: the front matter opened by '---' is never closed")
    try:
        meta = yaml.safe_load(parts[1]) or {}
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0]
        raise UsageError(f"{path}: the front matter is not valid YAML ({first})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: the front matter must be a YAML mapping")
    return meta


def is_notebook_source(path: Path) -> bool:
    """True for a MyST-markdown notebook (jupytext front matter with a kernelspec)."""
    if path.suffix == ".ipynb":
        return True
    meta = _front_matter(path)
    return "kernelspec" in meta or "jupytext" in meta


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read a notebook source and check it has exactly one ``parameters`` cell.

    Raises :class:`UsageError` for a missing file, a folder, a file that is not
    a MyST-markdown notebook (or ``.ipynb``), or a broken front matter.
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a folder, not a chapter source (.md or .ipynb)")
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.suffix not in (".md", ".ipynb"):
        raise UsageError(f"{path}: a chapter source is a MyST-markdown (.md) or .ipynb file")
    if not is_notebook_source(path):
        raise UsageError(f"{path}: not a notebook (its front matter has no kernelspec or "
                         "jupytext section)")
    try:
        nb = jupytext.read(path)
    except Exception as err:  # jupytext's errors for malformed sources vary
        raise UsageError(f"{path}: cannot be read as a notebook ({err})") from None
    tagged = [i for i, c in enumerate(nb.cells) if PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise BookBuildError(
            f"{path}: expected exactly one cell tagged 'parameters', found {len(tagged)}"
        )
    nb.metadata["kernelspec"] = {
        "name": KERNEL_NAME, "display_name": "Python 3", "language": "python"
    }
    return nb


def declared_parameters(nb: nbformat.NotebookNode) -> dict[str, object]:
    """The names assigned in a notebook's ``parameters`` cell, with their defaults.

    Only plain assignments of literals (``quick = False``, ``lr = 2e-4``) count.
    """
    cell = next(c for c in nb.cells if PARAMETERS_TAG in c.metadata.get("tags", []))
    declared: dict[str, object] = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                declared[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                declared[node.targets[0].id] = None  # not a literal: any value
    return declared


def _type_name(value: object) -> str:
    return "a bool (true/false)" if isinstance(value, bool) else f"a {type(value).__name__}"


def check_parameter(name: str, value: object, default: object, where: str) -> object:
    """``value`` for parameter ``name`` if it has the type of ``default``.

    A float parameter accepts an integer (converted); a parameter whose default
    is ``None`` or not a literal accepts any type. The value must then pass the
    parameter's rule in :mod:`grpo_companion.book.parameters` (its range).
    Raises :class:`UsageError`.
    """
    if default is None:
        ok = True
    elif isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(default, bool) and isinstance(value, bool)
    elif isinstance(default, float) and isinstance(value, int):
        ok, value = True, float(value)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise UsageError(f"parameter {name} of {where} must be {_type_name(default)} like its "
                         f"default {default!r}, got {value!r}")
    try:
        return check_value(name, value)
    except ValueError as err:
        raise UsageError(f"parameter {name} of {where}: {err}") from None


def notebook_parameters_for(nb: nbformat.NotebookNode, parameters: Mapping[str, object],
                            where: str, strict: bool = True) -> dict[str, object]:
    """The subset of ``parameters`` that the notebook declares, type-checked.

    With ``strict`` every name must be declared by this notebook; otherwise the
    names it does not declare are left out (a book-wide ``-p`` reaches only the
    chapters that have that parameter).
    """
    declared = declared_parameters(nb)
    out = {}
    for name, value in parameters.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise UsageError(f"parameter name {name!r} is not a Python identifier")
        if name not in declared:
            if strict:
                raise UsageError(f"{where} has no parameter {name!r}; its parameters cell "
                                 f"declares {', '.join(sorted(declared)) or 'nothing'}")
            continue
        out[name] = check_parameter(name, value, declared[name], where)
    return out


# ------------------------------------------------------------------------- cache


def library_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of every Python source file of the library (path and content)."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(package_dir)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def cache_key(notebook_text: str, parameters: Mapping[str, object], library: str,
              kernel: str = "") -> str:
    """Key of an executed notebook: its source, its parameters, the library, and
    the kernel (name, Python version and :func:`grpo_companion.book.kernel.kernel_digest`: the
    kernel's settings and the installed packages)."""
    h = hashlib.sha256()
    for part in (
        notebook_text,
        json.dumps(dict(parameters), sort_keys=True, default=str),
        library,
        KERNEL_NAME,
        f"{sys.version_info.major}.{sys.version_info.minor}",
        kernel,
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


# ------------------------------------------------------------------------ files


def mathjax_source_dir() -> Path:
    """MathJax 3 ``es5`` bundle shipped by the ``django-static-mathjax`` wheel."""
    import mathjax  # the django-static-mathjax distribution installs this module

    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").exists():
        raise BookBuildError(f"MathJax bundle not found at {es5}; reinstall the environment")
    return es5


def stage_mathjax(stage: Path) -> None:
    """Copy the MathJax bundle into ``_static`` so pages render math offline."""
    src = mathjax_source_dir()
    static = stage / "_static"
    dst = static / MATHJAX_DIRNAME
    marker = dst / ".source"  # written last: a folder without it is a partial copy
    if marker.exists() and marker.read_text() == str(src):
        return
    static.mkdir(parents=True, exist_ok=True)
    prefix = f".{MATHJAX_DIRNAME}.tmp-"
    for stale in static.glob(f"{prefix}*"):  # left by a killed build (the caller holds the lock)
        shutil.rmtree(stale, ignore_errors=True)
    # copy into a private folder beside it, then swap it in with renames, so that
    # the bundle in place is always complete and a partial copy is never built on
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=static))
    try:
        # the speech-rule engine (sre) is only for assistive speech output; it is
        # loaded on demand from the same local folder, so keep the full bundle
        copy = work / MATHJAX_DIRNAME
        shutil.copytree(src, copy)
        (copy / ".source").write_text(str(src))
        if dst.exists() or dst.is_symlink():
            os.replace(dst, work / "replaced")
        os.replace(copy, dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stage_plotly(stage: Path) -> None:
    """Copy Plotly's JavaScript (shipped by the pinned ``plotly`` wheel) into
    ``_static/plotly/plotly.min.js``, so that the interactive explorer needs no network.

    Done as :func:`stage_mathjax` does it: copied into a private folder beside the
    destination and swapped in by renames, with a ``.source`` marker (the file and the
    plotly version) written last, so that a partial copy is never built on."""
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not src.exists():
        raise BookBuildError(f"Plotly's JavaScript not found at {src}; reinstall the environment")
    static = stage / "_static"
    dst = static / "plotly"
    marker = dst / ".source"
    source = f"{src} {plotly.__version__}"
    if marker.exists() and marker.read_text() == source and (dst / src.name).exists():
        return
    static.mkdir(parents=True, exist_ok=True)
    prefix = ".plotly.tmp-"
    for stale in static.glob(f"{prefix}*"):  # left by a killed build (the caller holds the lock)
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=static))
    try:
        copy = work / "plotly"
        copy.mkdir()
        shutil.copy2(src, copy / src.name)
        (copy / ".source").write_text(source)
        if dst.exists() or dst.is_symlink():
            os.replace(dst, work / "replaced")
        os.replace(copy, dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------- execution


#: Notebook metadata key holding the figures each cell drew (by execution count).
DRAWN_KEY = "grpo_companion_figures_drawn"
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")
HIDDEN_OUTPUT_TAGS = ("remove-output", "remove-cell", "hide-output")


def code_cell_lines(source: Path) -> list[int]:
    """Line number (1-based) of each ``{code-cell}`` fence of a MyST notebook source."""
    if source.suffix != ".md":
        return []
    return [i for i, line in enumerate(source.read_text().splitlines(), 1)
            if line.lstrip().startswith("```{code-cell}")]


def describe_cell(nb: nbformat.NotebookNode, index: int, source: Path | None) -> str:
    """Name cell ``index`` of an executed notebook as its source counts it: the
    n-th code cell (papermill's injected cell does not count) and its line."""
    ordinal = 0
    for cell in nb.cells[: index + 1]:
        if cell.cell_type == "code" and INJECTED_TAG not in cell.metadata.get("tags", []):
            ordinal += 1
    if INJECTED_TAG in nb.cells[index].metadata.get("tags", []):
        return "the injected parameters cell"
    where = f"code cell {ordinal}"
    lines = code_cell_lines(source) if source is not None else []
    if source is not None and 0 < ordinal <= len(lines):
        where += f" (line {lines[ordinal - 1]} of {source})"
    return where


def _output_hidden(cell: nbformat.NotebookNode) -> bool:
    """True when the book does not show the cell's outputs."""
    return any(t in cell.metadata.get("tags", []) for t in HIDDEN_OUTPUT_TAGS)


def _figure_metadata(cell: nbformat.NotebookNode) -> tuple[dict, dict]:
    """The cell's ``mystnb.figure`` and ``mystnb.image`` options (empty when absent)."""
    mystnb = cell.metadata.get("mystnb", {})
    return mystnb.get("figure", {}), mystnb.get("image", {})


def image_outputs(cell: nbformat.NotebookNode) -> int:
    """Number of outputs of a cell that carry an image."""
    return sum(1 for out in cell.get("outputs", [])
               if any(t in out.get("data", {}) for t in IMAGE_TYPES))


@dataclass(frozen=True)
class Figure:
    """A figure a reader sees: the cell that draws it, its caption metadata and, when
    :func:`grpo_companion.plotting.use_book_style` recorded it, its text sizes
    (:func:`grpo_companion.plotting.text_record`) and the SHA-256 of its image (the
    name MyST-NB gives the image file)."""

    cell: int
    name: str
    caption: str
    alt: str
    text: Mapping | None = None
    image_sha256: str = ""


def _image_output(out: Mapping) -> tuple[str, Mapping | None] | None:
    """SHA-256 of an output's image bytes and its text record; None if it has no image."""
    for mime in IMAGE_TYPES:
        if mime in out.get("data", {}):
            data = out["data"][mime]
            try:
                raw = data.encode() if mime == "image/svg+xml" else base64.b64decode(data)
            except (TypeError, ValueError):  # not base64: no file of ours has this name
                raw = str(data).encode()
            record = out.get("metadata", {}).get(mime, {}).get(TEXT_RECORD_KEY)
            return hashlib.sha256(raw).hexdigest(), record
    return None


def visible_figures(nb: nbformat.NotebookNode) -> list[Figure]:
    """The figures of an executed notebook that its page shows, in order."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not image_outputs(cell):
            continue
        if _output_hidden(cell):
            continue
        figure, image = _figure_metadata(cell)
        for output in cell.get("outputs", []):
            seen = _image_output(output)
            if seen is not None:
                out.append(Figure(i, str(figure.get("name", "")),
                                  str(figure.get("caption", "")), str(image.get("alt", "")),
                                  text=seen[1], image_sha256=seen[0]))
    return out


def check_figures(nb: nbformat.NotebookNode, created: Mapping[int, int], name: str,
                  source: Path | None = None) -> list[Figure]:
    """Check that every figure drawn is shown, numbered, captioned and described.

    ``created`` maps execution counts to the number of matplotlib figures each
    cell created (logged by :mod:`grpo_companion.book.kernel_hooks`). A cell fails the check when
    it created more figures than it has image outputs (it drew but showed
    nothing), or when it shows an image without a ``mystnb.figure`` name and
    caption and a ``mystnb.image`` alt text, or shows more than one output
    (MyST-NB wraps every displayed output of such a cell in the same numbered
    figure; values glued with ``display=False`` are not displayed).

    Returns the visible figures; raises :class:`BookBuildError` naming the
    notebook and the cell otherwise.
    """
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        where = describe_cell(nb, i, source)
        images = image_outputs(cell)
        drawn = created.get(cell.get("execution_count") or -1, 0)
        if drawn > images:
            problems.append(f"{where} drew {drawn} figure(s) but shows {images} image(s); "
                            "is the kernel's matplotlib backend inline?")
        if not images or _output_hidden(cell):
            continue
        figure, image = _figure_metadata(cell)
        missing = [key for key, value in (("mystnb.figure.name", figure.get("name")),
                                          ("mystnb.figure.caption", figure.get("caption")),
                                          ("mystnb.image.alt", image.get("alt")))
                   if not value]
        if missing:
            problems.append(f"{where} shows a figure without {', '.join(missing)}")
        displays = [o for o in cell.get("outputs", [])
                    if o.get("output_type") in ("display_data", "execute_result")
                    and not o.get("metadata", {}).get("scrapbook", {}).get("mime_prefix")]
        if len(displays) != 1:
            problems.append(f"{where} is a figure cell with {len(displays)} displayed outputs; "
                            "it must show exactly one image")
    if problems:
        raise BookBuildError(f"{name}: " + "; ".join(problems))
    return visible_figures(nb)


def execute_notebook(
    nb: nbformat.NotebookNode,
    output_path: Path,
    parameters: Mapping[str, object],
    cwd: Path,
    cell_timeout: int,
    source: Path | None = None,
) -> nbformat.NotebookNode:
    """Execute ``nb`` with papermill into ``output_path`` (kept on failure).

    Papermill reads and writes in a private folder (``tempfile.mkdtemp``);
    ``output_path`` is replaced atomically once papermill is done (a cell that
    raised, timed out or killed the kernel included), so that an interrupted
    run leaves any earlier file there as it was.

    The kernel runs in the pipeline's own environment
    (:func:`grpo_companion.book.kernel.kernel_session`), and the executed
    notebook is checked with :func:`check_figures`.

    Raises
    ------
    BookBuildError
        naming the notebook and the failing cell (as the source ``source``
        counts it) when a cell raises, times out or kills the kernel, or when a
        figure is drawn but not shown.
    """
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    output_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="grpo-companion-run-"))
    input_path = scratch / "input.ipynb"
    partial = scratch / "output.ipynb"  # what papermill saves as it goes
    nbformat.write(nb, input_path)
    name = str(source) if source is not None else output_path.name
    kept = f"\n  the executed notebook is kept at {output_path}"
    quiet = logging.getLogger("papermill")  # its messages repeat what our errors say
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with kernel_session() as session:
            try:
                papermill.execute_notebook(
                    str(input_path),
                    str(partial),
                    parameters=dict(parameters),
                    kernel_name=KERNEL_NAME,
                    cwd=str(cwd),
                    execution_timeout=cell_timeout,
                    progress_bar=False,
                    log_output=False,
                    kernel_manager_class=session.manager_class,
                )
            except PapermillExecutionError as err:
                executed = _publish(partial, output_path, source)
                # err.cell_index counts the cells before papermill added its error banners
                executed.cells = [c for c in executed.cells
                                  if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
                raise BookBuildError(
                    f"{name}: {describe_cell(executed, err.cell_index, source)} raised "
                    f"{err.ename}: {err.evalue}{kept} with its traceback"
                ) from None
            except (CellTimeoutError, DeadKernelError) as err:
                what = (f"ran longer than the cell timeout of {cell_timeout} s"
                        if isinstance(err, CellTimeoutError) else "killed the kernel")
                running = _running_cell(partial, source)
                if partial.exists():
                    _publish(partial, output_path, source)
                raise BookBuildError(f"{name}: {running} {what}{kept}") from None
            created = session.figures_created()
        executed = _publish(partial, output_path, source)
    finally:
        quiet.setLevel(level)
        shutil.rmtree(scratch, ignore_errors=True)
    check_figures(executed, created, name, source)
    executed.metadata[DRAWN_KEY] = {str(k): v for k, v in sorted(created.items())}
    return tag_for_the_book(executed)


def _publish(partial: Path, output_path: Path, source: Path | None) -> nbformat.NotebookNode:
    """Move papermill's notebook from the scratch folder to ``output_path``
    atomically, naming the real paths (not the scratch ones) in its metadata."""
    executed = nbformat.read(partial, as_version=4)
    meta = executed.metadata.get("papermill")
    if isinstance(meta, dict):
        meta["input_path"] = str(source) if source is not None else None
        meta["output_path"] = str(output_path)
    atomic_write(output_path, nbformat.writes(executed).encode())
    return executed


def tag_for_the_book(executed: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Hide papermill's injected cell and give wide figures the margin (in place)."""
    for cell in executed.cells:
        tags = cell.metadata.setdefault("tags", [])
        if INJECTED_TAG in tags and "remove-cell" not in tags:
            tags.append("remove-cell")  # hide papermill's injected cell in the book
        if _display_width(cell) > WIDE_FIGURE_PX and "full-width" not in tags:
            tags.append("full-width")  # the theme lets it use the margin on wide screens
    return executed


#: A figure wider than this (in CSS pixels at its 1x size) would be shrunk into the
#: text column until its labels are hard to read; such cells get the book theme's
#: ``full-width`` tag, which gives them the right margin too on screens >= 992 px.
WIDE_FIGURE_PX = 820


def _display_width(cell: nbformat.NotebookNode) -> float:
    """Largest display width (1x pixels, from the output metadata) of a cell's images."""
    widths = [float(out.get("metadata", {}).get(t, {}).get("width", 0))
              for out in cell.get("outputs", []) for t in IMAGE_TYPES
              if t in out.get("data", {})]
    return max(widths, default=0.0)


def _running_cell(output_path: Path, source: Path | None) -> str:
    """The cell that was executing when papermill stopped: the last one it started."""
    try:
        nb = nbformat.read(output_path, as_version=4)
    except Exception:  # papermill had not written it yet
        return "a cell"
    started = [i for i, cell in enumerate(nb.cells)
               if cell.metadata.get("papermill", {}).get("start_time")]
    return describe_cell(nb, started[-1], source) if started else "a cell"


@dataclass
class ChapterResult:
    doc: str
    cached: bool
    seconds: float
    figures: int = 0


def _figures(n: int) -> str:
    return f"{n} figure{'s' if n != 1 else ''}"


def checksum_path(cached: Path) -> Path:
    """The sidecar holding the SHA-256 of a cached notebook's bytes."""
    return cached.with_name(cached.name + CHECKSUM_SUFFIX)


def _checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_cached(cached: Path, data: bytes) -> None:
    """Write a cache entry: the notebook, then the checksum of exactly these bytes
    (an entry cut short between the two has no checksum, so it is not reused)."""
    write_if_changed(cached, data)
    write_if_changed(checksum_path(cached), f"{_checksum(data)}\n".encode())


def _checksum_matches(cached: Path, data: bytes) -> bool:
    try:
        expected = checksum_path(cached).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return False
    return expected == _checksum(data)


def _remove_cached(cached: Path) -> None:
    cached.unlink(missing_ok=True)
    checksum_path(cached).unlink(missing_ok=True)


def _valid_cached(path: Path, source: Path, data: bytes | None = None) -> bool:
    """A cached notebook is reused only if it passes :func:`check_figures` again
    (a notebook cached by an older pipeline, without the figure log, does not)."""
    try:
        nb = nbformat.reads((path.read_bytes() if data is None else data).decode(),
                            as_version=4)
        drawn = nb.metadata.get(DRAWN_KEY)
        if drawn is None:
            return False
        check_figures(nb, {int(k): v for k, v in drawn.items()}, path.name, source)
    except Exception:
        return False
    return True


def check_selection(root: Path, toc: Mapping, select: Iterable[str]) -> None:
    """Raise :class:`UsageError`, listing the chapters, if a ``--select`` text
    matches no notebook of the table of contents."""
    notebooks = []
    for doc in documents_of(toc):
        try:
            if is_notebook_source(source_path(root, doc)):
                notebooks.append(doc)
        except BookBuildError:
            continue
    missing = [text for text in select if not any(text in doc for doc in notebooks)]
    if missing:
        raise UsageError(f"--select {', '.join(map(repr, missing))} matches no chapter; the "
                         f"chapters are: {', '.join(Path(d).name for d in notebooks)}")


def _reusable_cached(cached: Path, src: Path, doc: str, log) -> bytes | None:
    """The bytes of a cache entry that may be staged, or None (after removing a
    bad entry): it must pass the figure check and match its checksum."""
    if not cached.exists():
        return None
    data = cached.read_bytes()
    if not _valid_cached(cached, src, data):
        log(f"  {doc}: cached notebook fails the figure check; executing it again")
    elif not _checksum_matches(cached, data):
        log(f"  {doc}: cached notebook does not match its checksum (edited, cut short or "
            "cached before checksums); executing it again")
    else:
        return data
    _remove_cached(cached)
    return None


_held_locks = threading.local()


@contextlib.contextmanager
def build_lock(out: Path):
    """Hold ``<out>/.build.lock`` (``fcntl.flock``) for a staging or a build.

    A second build into the same folder does not wait (a build takes minutes and
    would do the same work again): it fails at once with a :class:`UsageError`,
    which the command line reports as one line with exit status 2. The lock is
    reentrant within a thread (:func:`build` holds it around
    :func:`stage_documents`) and the kernel drops it when the process dies.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    key = os.path.realpath(path)
    held = getattr(_held_locks, "paths", None)
    if held is None:
        held = _held_locks.paths = {}
    if key in held:
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise UsageError(f"another build{by} is using {out}; wait for it to finish or "
                             "pass another --out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        held[key] = 1
        try:
            yield
        finally:
            del held[key]
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def stage_documents(opts: BuildOptions, log=print) -> list[ChapterResult]:
    """Stage every toc page, executing (or reusing) notebooks; returns timings.

    Holds :func:`build_lock` on ``opts.out`` throughout."""
    with build_lock(opts.out):
        return _stage_documents(opts, log)


def _stage_documents(opts: BuildOptions, log) -> list[ChapterResult]:
    root, stage = opts.root, opts.stage
    stage.mkdir(parents=True, exist_ok=True)
    opts.cache.mkdir(parents=True, exist_ok=True)
    for folder in (stage, opts.cache, opts.out / "exec"):  # left by a killed build
        sweep_stale_temporaries(folder)
    for name in BOOK_FILES:
        copy_if_changed(root / name, stage / name)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    if opts.select:
        check_selection(root, toc, opts.select)

        def keep(doc: str) -> bool:
            if any(s in doc for s in opts.select):
                return True
            try:
                return not is_notebook_source(source_path(root, doc))
            except BookBuildError:  # not written yet: a partial book can do without it
                return False

        toc = select_toc(toc, keep)
        write_if_changed(stage / "_toc.yml", yaml.safe_dump(toc, sort_keys=False).encode())
    stage_mathjax(stage)
    stage_plotly(stage)
    if (root / "_static").is_dir():
        for path in (root / "_static").rglob("*"):
            if path.is_file():
                copy_if_changed(path, stage / path.relative_to(root))

    # read every notebook and check the parameters before executing anything
    pages: list[tuple[str, Path, nbformat.NotebookNode | None, dict[str, object]]] = []
    for doc in documents_of(toc):
        src = source_path(root, doc)
        if not is_notebook_source(src):
            pages.append((doc, src, None, {}))
            continue
        nb = read_notebook(src)
        pages.append((doc, src, nb, notebook_parameters_for(
            nb, opts.notebook_parameters(), str(src.relative_to(root)), strict=False)))
    unknown = set(opts.parameters) - {name for *_, params in pages for name in params}
    if unknown:
        raise UsageError(f"no chapter of the book has a parameter named "
                         f"{', '.join(sorted(map(repr, unknown)))}")

    library, kernel = library_digest(), kernel_digest()
    results: list[ChapterResult] = []
    earlier = hashlib.sha256()  # executed notebooks so far, for pages that summarise them
    for doc, src, nb, parameters in pages:
        if nb is None:
            copy_if_changed(src, stage / src.relative_to(root))
            continue
        text = src.read_text()
        deps = nb.metadata.get("grpo_companion", {})
        if deps.get("depends_on_previous"):
            text += earlier.hexdigest()  # e.g. the claims ledger reads earlier chapters
        for name in deps.get("depends_on_files", []):  # data files a page renders
            dep = root / name
            text += hashlib.sha256(dep.read_bytes() if dep.exists() else b"").hexdigest()
        key = cache_key(text, parameters, library, kernel)
        cached = opts.cache / f"{Path(doc).name}-{key}.ipynb"
        target = stage / f"{doc}.ipynb"
        t0 = time.perf_counter()
        reused = _reusable_cached(cached, src, doc, log)
        if reused is not None:  # stage exactly the bytes that were checked
            write_if_changed(target, reused)
            earlier.update(reused)
            figures = len(visible_figures(nbformat.reads(reused.decode(), as_version=4)))
            results.append(ChapterResult(doc, True, 0.0, figures))
            log(f"  {doc}: cached ({_figures(figures)})")
            continue
        log(f"  {doc}: executing ({'quick' if opts.quick else 'full'} mode)")
        work = opts.out / "exec" / f"{doc}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)  # the notebook runs in there
        executed = execute_notebook(nb, work, parameters, cwd=target.parent,
                                    cell_timeout=opts.cell_timeout, source=src)
        data = nbformat.writes(executed).encode()
        earlier.update(data)
        for old in opts.cache.glob(f"{Path(doc).name}-*.ipynb"):
            _remove_cached(old)
        for orphan in opts.cache.glob(f"{Path(doc).name}-*.ipynb{CHECKSUM_SUFFIX}"):
            orphan.unlink(missing_ok=True)
        write_cached(cached, data)
        write_if_changed(target, data)
        seconds = time.perf_counter() - t0
        figures = len(visible_figures(executed))
        results.append(ChapterResult(doc, False, seconds, figures))
        log(f"  {doc}: executed in {seconds:.1f} s ({_figures(figures)})")
    return results


# ------------------------------------------------------------------------ sphinx


def _bin(name: str) -> str:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else name


def write_sphinx_config(stage: Path, log=print, root: Path = REPO_ROOT) -> None:
    """Generate ``conf.py`` from ``_config.yml``/``_toc.yml`` (jupyter-book's own translation).

    The repository and launch buttons of the page header are added here, at build time, from
    the address :func:`grpo_companion.book.links.resolve_repository` finds for ``root`` (both
    are left out, and the log says so in one line, when none is known)."""
    from grpo_companion.book import links

    tmp = stage / ".confgen"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    shutil.copy2(stage / "_toc.yml", tmp / "_toc.yml")
    repository = links.resolve_repository(root=root)
    log(f"   {repository.describe()}")
    try:
        branch = links.repository_branch()
    except ValueError as err:
        raise UsageError(str(err)) from None
    config = links.with_repository(yaml.safe_load((stage / "_config.yml").read_text()),
                                   repository.url, branch)
    (tmp / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([_bin("jupyter-book"), "config", "sphinx", str(tmp)], check=True,
                   stdout=subprocess.DEVNULL)
    write_if_changed(stage / "conf.py", (tmp / "conf.py").read_bytes())
    shutil.rmtree(tmp)


#: Where a target is defined in a MyST page: ``(label)=``, a directive's ``:label:`` or
#: ``:name:``, a display equation's ``$$ ... $$ (label)``, and a figure cell's
#: ``mystnb: figure: name:`` metadata (an indented ``name:``).
_TARGET = re.compile(r"^\(([^()\s]+)\)=\s*$|^\s*:(?:label|name):\s*(\S+)"
                     r"|\$\$\s*\(([^()\s]+)\)|^\s+name:\s*(\S+)\s*$", re.MULTILINE)
#: Sphinx's warnings for a reference whose target it does not have.
_MISSING = re.compile(r"WARNING: (?:undefined label|unknown document): '?([^'\s]+)'?")


def left_out_targets(root: Path, selected: Iterable[str]) -> set[str]:
    """The documents of the full table of contents that are not in ``selected``, and the
    labels their sources define: what a preview of ``selected`` may refer to without having."""
    full = documents_of(yaml.safe_load((root / "_toc.yml").read_text()))
    kept = set(selected)
    targets: set[str] = set()
    for doc in full:
        if doc in kept:
            continue
        targets.add(doc)
        try:
            text = source_path(root, doc).read_text()
        except BookBuildError:  # not written yet
            continue
        targets |= {next(g for g in match if g) for match in _TARGET.findall(text)}
    return targets


def split_warnings(lines: Iterable[str], left_out: set[str]) -> tuple[list[str], list[str]]:
    """``(expected, real)``: Sphinx's warning lines for references into ``left_out`` (a preview
    does not build those pages), and every other warning or error."""
    expected, real = [], []
    for line in lines:
        if "WARNING" not in line and "ERROR" not in line:
            continue
        match = _MISSING.search(line)
        target = match.group(1).removeprefix("/") if match else None
        (expected if target is not None and target in left_out else real).append(line)
    return expected, real


def build_html(opts: BuildOptions, log=print) -> None:
    """Render the staged tree with Sphinx, warnings as errors.

    A preview of some chapters (``opts.select``) leaves the other pages out, so references
    into them cannot resolve: those warnings (and only those) are expected, counted and
    shown as plain text on the page; any other warning fails the preview as it fails the book.
    A failed build removes Sphinx's saved environment, so that the next build reads every
    page again and reports the same warnings (an incremental build re-reads only the pages
    that changed, and would otherwise pass without them).
    """
    write_sphinx_config(opts.stage, log=log, root=opts.root)
    doctrees = opts.out / "doctrees"
    strict = [] if opts.select else ["-W", "--keep-going"]
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-n", *strict, "-q",
           "-d", str(doctrees), str(opts.stage), str(opts.html)]
    # a preview reads Sphinx's warnings (its stderr) to tell the expected ones from the rest
    proc = subprocess.run(cmd, stderr=subprocess.PIPE if opts.select else None, text=True)
    real: list[str] = []
    if opts.select:
        stage_toc = yaml.safe_load((opts.stage / "_toc.yml").read_text())
        expected, real = split_warnings(proc.stderr.splitlines(),
                                        left_out_targets(opts.root, documents_of(stage_toc)))
        # all of Sphinx's output when it failed; else only the warnings that fail the preview
        shown = proc.stderr if proc.returncode else "".join(f"{line}\n" for line in real)
        print(shown, end="", file=sys.stderr)
        if expected:
            log(f"   {len(expected)} references point at pages this preview leaves out "
                "(shown as plain text)")
    if proc.returncode or real:
        shutil.rmtree(doctrees, ignore_errors=True)  # the next build reports them again
        raise BookBuildError(
            f"Sphinx reported errors (exit {proc.returncode}); see above" if proc.returncode
            else f"Sphinx reported {len(real)} warning(s) in the selected pages; see above")


def build(opts: BuildOptions, log=print) -> list[ChapterResult]:
    """Stage, execute and render the whole book; returns per-notebook timings."""
    t0 = time.perf_counter()
    with build_lock(opts.out):  # one build at a time into opts.out (see build_lock)
        log(f"== staging and executing notebooks into {opts.stage}")
        results = stage_documents(opts, log=log)
        log("== building HTML with Sphinx (-n -W --keep-going)" if not opts.select else
            "== building HTML with Sphinx (-n; only references to left-out pages may fail)")
        build_html(opts, log=log)
        exported = export_reader_notebooks(
            opts.stage, opts.html, opts.out / "doctrees", opts.stage / "references.bib",
            toc_documents(opts.stage))
        log(f"== {exported} download notebooks rewritten in plain Markdown (book.export)")
    log(f"== book ready: {opts.html / 'index.html'} ({time.perf_counter() - t0:.1f} s)")
    return results
