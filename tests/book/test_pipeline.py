"""The notebook pipeline: toc, parameters cells, cache keys, failure reporting."""

from __future__ import annotations

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
    assert "one.ipynb" in message and "cell" in message and "ZeroDivisionError" in message
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
