"""Build the executed book: jupytext -> papermill (cached) -> jupyter-book (Sphinx).

The sources stay untouched. Every page listed in ``_toc.yml`` is staged into
``<out>/stage``: plain MyST pages are copied, MyST-markdown notebooks (files with
jupytext front matter) are converted to ``.ipynb`` and executed by papermill in
the staged copy of their folder. An executed notebook is cached under
``<out>/cache`` with a key made of the notebook text, the parameters, the
library's source and the kernel name, so that an unchanged chapter is not run
again while any edit to ``grpo_companion`` re-executes every chapter. Sphinx
then renders the staged tree with execution off and ``-n -W --keep-going``, so
that a broken reference, a missing citation or a bad option fails the build.

The staged tree is only rewritten where content changed, so that Sphinx's
incremental build (keyed on file modification times) stays warm.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jupytext
import nbformat
import yaml

PACKAGE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_DIR.parent
KERNEL_NAME = "python3"
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
BOOK_FILES = ("_config.yml", "_toc.yml", "references.bib")
MATHJAX_DIRNAME = "mathjax"


class BookBuildError(RuntimeError):
    """A chapter failed to execute or Sphinx reported errors."""


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
        previewing a chapter quickly; cross-references to left-out chapters
        then fail).
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


def is_notebook_source(path: Path) -> bool:
    """True for a MyST-markdown notebook (jupytext front matter with a kernelspec)."""
    if path.suffix == ".ipynb":
        return True
    text = path.read_text()
    if not text.startswith("---"):
        return False
    front = text.split("---", 2)[1]
    meta = yaml.safe_load(front) or {}
    return "kernelspec" in meta or "jupytext" in meta


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read a notebook source and check it has exactly one ``parameters`` cell."""
    nb = jupytext.read(path)
    tagged = [i for i, c in enumerate(nb.cells) if PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise BookBuildError(
            f"{path}: expected exactly one cell tagged 'parameters', found {len(tagged)}"
        )
    nb.metadata["kernelspec"] = {
        "name": KERNEL_NAME, "display_name": "Python 3", "language": "python"
    }
    return nb


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


def cache_key(notebook_text: str, parameters: Mapping[str, object], library: str) -> str:
    """Key of an executed notebook: its source, its parameters, the library, the kernel."""
    h = hashlib.sha256()
    for part in (
        notebook_text,
        json.dumps(dict(parameters), sort_keys=True, default=str),
        library,
        KERNEL_NAME,
        f"{sys.version_info.major}.{sys.version_info.minor}",
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


# ------------------------------------------------------------------------ files


def write_if_changed(path: Path, data: bytes) -> bool:
    """Atomically write ``data`` unless the file already holds it; True if written."""
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def copy_if_changed(src: Path, dst: Path) -> bool:
    return write_if_changed(dst, src.read_bytes())


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
    dst = stage / "_static" / MATHJAX_DIRNAME
    marker = dst / ".source"
    if marker.exists() and marker.read_text() == str(src):
        return
    if dst.exists():
        shutil.rmtree(dst)
    # the speech-rule engine (sre) is only for assistive speech output; it is
    # loaded on demand from the same local folder, so keep the full bundle
    shutil.copytree(src, dst)
    marker.write_text(str(src))


# --------------------------------------------------------------------- execution


def execute_notebook(
    nb: nbformat.NotebookNode,
    output_path: Path,
    parameters: Mapping[str, object],
    cwd: Path,
    cell_timeout: int,
) -> nbformat.NotebookNode:
    """Execute ``nb`` with papermill into ``output_path`` (kept on failure).

    Raises
    ------
    BookBuildError
        naming the notebook and the failing cell when a cell raises.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    output_path.parent.mkdir(parents=True, exist_ok=True)
    input_path = output_path.with_name(f".{output_path.stem}.input.ipynb")
    nbformat.write(nb, input_path)
    try:
        papermill.execute_notebook(
            str(input_path),
            str(output_path),
            parameters=dict(parameters),
            kernel_name=KERNEL_NAME,
            cwd=str(cwd),
            execution_timeout=cell_timeout,
            progress_bar=False,
            log_output=False,
        )
    except PapermillExecutionError as err:
        raise BookBuildError(
            f"{output_path.name}: cell {err.cell_index} (execution count {err.exec_count}) "
            f"raised {err.ename}: {err.evalue}\n"
            f"  the executed notebook with its traceback is kept at {output_path}"
        ) from err
    finally:
        input_path.unlink(missing_ok=True)
    executed = nbformat.read(output_path, as_version=4)
    for cell in executed.cells:
        tags = cell.metadata.get("tags", [])
        if INJECTED_TAG in tags and "remove-cell" not in tags:
            tags.append("remove-cell")  # hide papermill's injected cell in the book
    return executed


@dataclass
class ChapterResult:
    doc: str
    cached: bool
    seconds: float


def stage_documents(opts: BuildOptions, log=print) -> list[ChapterResult]:
    """Stage every toc page, executing (or reusing) notebooks; returns timings."""
    root, stage = opts.root, opts.stage
    stage.mkdir(parents=True, exist_ok=True)
    opts.cache.mkdir(parents=True, exist_ok=True)
    for name in BOOK_FILES:
        copy_if_changed(root / name, stage / name)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    if opts.select:
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
    if (root / "_static").is_dir():
        for path in (root / "_static").rglob("*"):
            if path.is_file():
                copy_if_changed(path, stage / path.relative_to(root))

    library = library_digest()
    parameters = opts.notebook_parameters()
    results: list[ChapterResult] = []
    earlier = hashlib.sha256()  # executed notebooks so far, for pages that summarise them
    for doc in documents_of(toc):
        src = source_path(root, doc)
        if not is_notebook_source(src):
            copy_if_changed(src, stage / src.relative_to(root))
            continue
        nb = read_notebook(src)
        text = src.read_text()
        deps = nb.metadata.get("grpo_companion", {})
        if deps.get("depends_on_previous"):
            text += earlier.hexdigest()  # e.g. the claims ledger reads earlier chapters
        for name in deps.get("depends_on_files", []):  # data files a page renders
            dep = root / name
            text += hashlib.sha256(dep.read_bytes() if dep.exists() else b"").hexdigest()
        key = cache_key(text, parameters, library)
        cached = opts.cache / f"{Path(doc).name}-{key}.ipynb"
        target = stage / f"{doc}.ipynb"
        t0 = time.perf_counter()
        if cached.exists():
            copy_if_changed(cached, target)
            earlier.update(cached.read_bytes())
            results.append(ChapterResult(doc, True, 0.0))
            log(f"  {doc}: cached")
            continue
        log(f"  {doc}: executing ({'quick' if opts.quick else 'full'} mode)")
        work = opts.out / "exec" / f"{doc}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)  # the notebook runs in there
        executed = execute_notebook(nb, work, parameters,
                                    cwd=target.parent, cell_timeout=opts.cell_timeout)
        data = nbformat.writes(executed).encode()
        earlier.update(data)
        for old in opts.cache.glob(f"{Path(doc).name}-*.ipynb"):
            old.unlink()
        write_if_changed(cached, data)
        write_if_changed(target, data)
        seconds = time.perf_counter() - t0
        results.append(ChapterResult(doc, False, seconds))
        log(f"  {doc}: executed in {seconds:.1f} s")
    return results


# ------------------------------------------------------------------------ sphinx


def _bin(name: str) -> str:
    exe = Path(sys.executable).parent / name
    return str(exe) if exe.exists() else name


def write_sphinx_config(stage: Path) -> None:
    """Generate ``conf.py`` from ``_config.yml``/``_toc.yml`` (jupyter-book's own translation)."""
    tmp = stage / ".confgen"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(stage / name, tmp / name)
    subprocess.run([_bin("jupyter-book"), "config", "sphinx", str(tmp)], check=True,
                   stdout=subprocess.DEVNULL)
    write_if_changed(stage / "conf.py", (tmp / "conf.py").read_bytes())
    shutil.rmtree(tmp)


def build_html(opts: BuildOptions) -> None:
    """Render the staged tree with Sphinx, warnings as errors."""
    write_sphinx_config(opts.stage)
    cmd = [
        sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
        "-d", str(opts.out / "doctrees"), str(opts.stage), str(opts.html),
    ]
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise BookBuildError(f"Sphinx reported errors (exit {proc.returncode}); see above")


def build(opts: BuildOptions, log=print) -> list[ChapterResult]:
    """Stage, execute and render the whole book; returns per-notebook timings."""
    t0 = time.perf_counter()
    log(f"== staging and executing notebooks into {opts.stage}")
    results = stage_documents(opts, log=log)
    log("== building HTML with Sphinx (-n -W --keep-going)")
    build_html(opts)
    log(f"== book ready: {opts.html / 'index.html'} ({time.perf_counter() - t0:.1f} s)")
    return results
