"""The notebook pipeline: toc, parameters cells, cache keys, failure reporting."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import nbformat
import pytest

from grpo_companion.book import pipeline
from grpo_companion.book.pipeline import (
    REPO_ROOT,
    BookBuildError,
    BuildOptions,
    cache_key,
    is_notebook_source,
    library_digest,
    read_notebook,
    source_path,
    stage_documents,
    toc_documents,
)

HEADER = textwrap.dedent("""\
    ---
    jupytext:
      text_representation:
        extension: .md
        format_name: myst
    kernelspec:
      name: python3
      display_name: Python 3
      language: python
    ---
    """)


def _chapter(body: str, n_parameter_cells: int = 1) -> str:
    params = "```{code-cell} ipython3\n:tags: [parameters]\n\nquick = False\n```\n\n"
    return HEADER + "\n# A chapter\n\n" + params * n_parameter_cells + textwrap.dedent(body)


def _mini_book(root: Path, body: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("_config.yml", "references.bib"):
        shutil.copy(REPO_ROOT / name, root / name)
    (root / "_toc.yml").write_text("format: jb-book\nroot: index\nchapters:\n  - file: ch/one\n")
    (root / "index.md").write_text("# Index\n\nPlain page.\n")
    (root / "ch").mkdir(exist_ok=True)
    (root / "ch" / "one.md").write_text(_chapter(body))
    return root


def test_every_toc_entry_has_a_source_and_notebooks_have_one_parameters_cell() -> None:
    docs = toc_documents(REPO_ROOT)
    assert docs[0] == "intro"
    notebooks = 0
    for doc in docs:
        src = source_path(REPO_ROOT, doc)
        if is_notebook_source(src):
            nb = read_notebook(src)  # raises unless exactly one parameters cell
            params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
            assert "quick" in params[0].source, f"{doc}: parameters cell lacks `quick`"
            notebooks += 1
    assert notebooks >= 2


@pytest.mark.parametrize("n", [0, 2])
def test_parameters_cell_must_be_unique(tmp_path: Path, n: int) -> None:
    src = tmp_path / "c.md"
    src.write_text(_chapter("", n_parameter_cells=n))
    with pytest.raises(BookBuildError, match="exactly one cell tagged 'parameters'"):
        read_notebook(src)


def test_cache_key_depends_on_notebook_parameters_and_library() -> None:
    base = cache_key("nb", {"quick": True}, "lib")
    assert cache_key("nb", {"quick": True}, "lib") == base
    assert cache_key("nb2", {"quick": True}, "lib") != base
    assert cache_key("nb", {"quick": False}, "lib") != base
    assert cache_key("nb", {"quick": True}, "lib2") != base


def test_library_digest_sees_every_source_edit(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "a.py").write_text("x = 1\n")
    before = library_digest(pkg)
    (pkg / "sub" / "a.py").write_text("x = 2\n")
    assert library_digest(pkg) != before


def test_cache_skips_unchanged_and_reruns_after_library_edit(tmp_path: Path,
                                                             monkeypatch) -> None:
    root = _mini_book(tmp_path / "book", "```{code-cell} ipython3\nprint(quick)\n```\n")
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    first = stage_documents(opts, log=lambda *_: None)
    assert [r.cached for r in first] == [False]
    staged = nbformat.read(opts.stage / "ch" / "one.ipynb", as_version=4)
    printed = [o.get("text", "") for c in staged.cells for o in c.get("outputs", [])]
    assert "True\n" in printed  # the quick parameter reached the kernel
    injected = [c for c in staged.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "remove-cell" in injected[0].metadata["tags"]

    second = stage_documents(opts, log=lambda *_: None)
    assert [r.cached for r in second] == [True]

    monkeypatch.setattr(pipeline, "library_digest", lambda: "edited library")
    third = stage_documents(opts, log=lambda *_: None)
    assert [r.cached for r in third] == [False]


def test_failing_cell_names_notebook_and_cell_and_keeps_traceback(tmp_path: Path) -> None:
    body = "```{code-cell} ipython3\nx = 1\n```\n\n```{code-cell} ipython3\n1 / 0\n```\n"
    root = _mini_book(tmp_path / "book", body)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    with pytest.raises(BookBuildError) as err:
        stage_documents(opts, log=lambda *_: None)
    message = str(err.value)
    assert "one.md" in message and "ZeroDivisionError" in message
    assert "code cell 3 (line" in message  # as the source counts: parameters, x = 1, 1 / 0
    kept = opts.out / "exec" / "ch" / "one.ipynb"
    assert kept.exists()
    assert "ZeroDivisionError" in kept.read_text()
    assert not (opts.stage / "ch" / "one.ipynb").exists()
    assert not list(opts.cache.glob("one-*.ipynb"))


def test_select_toc_keeps_chosen_chapters_and_drops_empty_parts() -> None:
    toc = {
        "format": "jb-book",
        "root": "intro",
        "parts": [
            {"caption": "A", "chapters": [{"file": "ch/01_x"}, {"file": "ch/02_y"}]},
            {"caption": "B", "chapters": [{"file": "ch/03_z"}]},
            {"caption": "C", "chapters": [{"file": "bibliography"}]},
        ],
    }
    kept = pipeline.select_toc(toc, lambda f: "02" in f or f == "bibliography")
    assert pipeline.documents_of(kept) == ["intro", "ch/02_y", "bibliography"]
    assert [p["caption"] for p in kept["parts"]] == ["A", "C"]
    assert pipeline.documents_of(toc) == ["intro", "ch/01_x", "ch/02_y", "ch/03_z", "bibliography"]


# ----------------------------------------------------------------- figures

FIGURE_CELL = """\
```{code-cell} ipython3
---
tags: [remove-input]
mystnb:
  figure:
    name: fig-test-line
    caption: A straight line.
  image:
    alt: A rising straight line.
---
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([0, 1], [0, 1])
plt.show()
```
"""


def _images(nb: nbformat.NotebookNode) -> int:
    return sum(pipeline.image_outputs(c) for c in nb.cells if c.cell_type == "code")


def test_figures_appear_whatever_the_callers_matplotlib_settings(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """The regression of the 35 lost figures: MPLBACKEND=Agg (as the Makefile used to
    export), a MATPLOTLIBRC and a matplotlibrc in the current directory that all say Agg,
    and a user IPython startup file that switches to Agg, must not hide a figure."""
    hostile = tmp_path / "hostile"
    (hostile / "ipython" / "profile_default" / "startup").mkdir(parents=True)
    (hostile / "ipython" / "profile_default" / "startup" / "00-agg.py").write_text(
        "import matplotlib\nmatplotlib.use('Agg')\n")
    (hostile / "matplotlibrc").write_text("backend: Agg\n")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MATPLOTLIBRC", str(hostile / "matplotlibrc"))
    monkeypatch.setenv("IPYTHONDIR", str(hostile / "ipython"))
    monkeypatch.chdir(hostile)
    root = _mini_book(tmp_path / "book", FIGURE_CELL)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    [result] = stage_documents(opts, log=lambda *_: None)
    assert result.figures == 1
    staged = nbformat.read(opts.stage / "ch" / "one.ipynb", as_version=4)
    assert _images(staged) == 1
    [figure] = pipeline.visible_figures(staged)
    assert figure.name == "fig-test-line" and figure.alt and figure.caption
    png = next(o for c in staged.cells for o in c.get("outputs", []) if "image/png" in o.data)
    assert png.metadata["image/png"]["width"] > 0  # retina: shown at half its pixel size
    assert os.environ["MPLBACKEND"] == "Agg"  # the caller's environment is restored


def test_a_cell_that_draws_but_shows_nothing_fails_the_build(tmp_path: Path) -> None:
    """The check itself: under a non-inline backend the figure is drawn and lost."""
    body = FIGURE_CELL.replace("import matplotlib.pyplot as plt",
                               "import matplotlib\nmatplotlib.use('Agg')\n"
                               "import matplotlib.pyplot as plt")
    root = _mini_book(tmp_path / "book", body)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    with pytest.raises(BookBuildError) as err:
        stage_documents(opts, log=lambda *_: None)
    message = str(err.value)
    assert "one.md" in message and "code cell 2" in message
    assert "drew 1 figure(s) but shows 0 image(s)" in message
    fences = [i for i, text in enumerate((root / "ch" / "one.md").read_text().splitlines(), 1)
              if text.startswith("```{code-cell}")]
    assert f"line {fences[1]} of" in message
    assert not list(opts.cache.glob("one-*.ipynb"))


@pytest.mark.parametrize("drop", ["name", "caption", "alt"])
def test_a_figure_without_label_caption_or_alt_text_fails_the_build(tmp_path: Path,
                                                                   drop: str) -> None:
    key = {"name": "    name: fig-test-line\n", "caption": "    caption: A straight line.\n",
           "alt": "  image:\n    alt: A rising straight line.\n"}[drop]
    root = _mini_book(tmp_path / "book", FIGURE_CELL.replace(key, ""))
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    with pytest.raises(BookBuildError, match=rf"code cell 2 .*shows a figure without .*{drop}"):
        stage_documents(opts, log=lambda *_: None)


def test_check_figures_counts_displayed_outputs_of_a_figure_cell() -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("plt.show()", execution_count=1)
    cell.metadata = {"mystnb": {"figure": {"name": "f", "caption": "c"}, "image": {"alt": "a"}}}
    image = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": ""})
    text = nbformat.v4.new_output("display_data", data={"text/latex": "$x$"})
    glued = nbformat.v4.new_output("display_data", data={"application/papermill.record/x": "1"},
                                   metadata={"scrapbook": {"name": "x", "mime_prefix": "app"}})
    cell.outputs = [image, glued]
    nb.cells = [cell]
    assert len(pipeline.check_figures(nb, {1: 1}, "nb")) == 1
    cell.outputs = [image, text]
    with pytest.raises(BookBuildError, match="2 displayed outputs"):
        pipeline.check_figures(nb, {1: 1}, "nb")
    cell.outputs = [image]
    with pytest.raises(BookBuildError, match="drew 2 figure"):
        pipeline.check_figures(nb, {1: 2}, "nb")


def test_cache_from_an_older_pipeline_is_executed_again(tmp_path: Path) -> None:
    root = _mini_book(tmp_path / "book", FIGURE_CELL)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    stage_documents(opts, log=lambda *_: None)
    [cached] = opts.cache.glob("one-*.ipynb")
    nb = nbformat.read(cached, as_version=4)
    del nb.metadata[pipeline.DRAWN_KEY]  # as written before figures were checked
    for cell in nb.cells:
        cell.outputs = [o for o in cell.get("outputs", []) if "image/png" not in o.get("data", {})]
    nbformat.write(nb, cached)
    logged: list[str] = []
    [result] = stage_documents(opts, log=logged.append)
    assert not result.cached and result.figures == 1
    assert any("fails the figure check" in line for line in logged)


def test_cache_key_covers_the_kernel_environment(monkeypatch) -> None:
    from grpo_companion.book import kernel

    assert cache_key("nb", {}, "lib", "kernel a") != cache_key("nb", {}, "lib", "kernel b")
    before = kernel.kernel_digest()
    monkeypatch.setattr(kernel, "IPYTHON_KERNEL_CONFIG", kernel.IPYTHON_KERNEL_CONFIG + "# x\n")
    assert kernel.kernel_digest() != before
    monkeypatch.setattr(kernel, "installed_distributions", lambda: ["matplotlib==0.0"])
    assert kernel.kernel_digest() != before


def test_kernel_environment_replaces_the_callers_settings(tmp_path: Path) -> None:
    from grpo_companion.book.kernel import INLINE_BACKEND, KernelSession, kernel_environment

    session = KernelSession(tmp_path)
    env = kernel_environment(session, {"MPLBACKEND": "Agg", "MPLCONFIGDIR": "/x",
                                       "PYTHONSTARTUP": "/y.py", "PATH": "/bin"})
    assert env["MPLBACKEND"] == INLINE_BACKEND
    assert env["MATPLOTLIBRC"] == str(session.matplotlibrc)
    assert env["IPYTHONDIR"] == str(session.ipython_dir)
    assert env["PYTHONHASHSEED"] == "0"
    assert "MPLCONFIGDIR" not in env and "PYTHONSTARTUP" not in env
    assert env["PATH"] == "/bin"


def test_wide_figures_get_the_full_width_tag() -> None:
    nb = nbformat.v4.new_notebook()
    for width in (600, 1200):
        cell = nbformat.v4.new_code_cell("plt.show()")
        cell.outputs = [nbformat.v4.new_output(
            "display_data", data={"image/png": "iVBOR"},
            metadata={"image/png": {"width": width, "height": 400}})]
        nb.cells.append(cell)
    pipeline.tag_for_the_book(nb)
    assert "full-width" not in nb.cells[0].metadata["tags"]
    assert "full-width" in nb.cells[1].metadata["tags"]
