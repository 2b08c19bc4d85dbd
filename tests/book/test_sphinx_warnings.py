"""Sphinx's warnings: a failed build fails again, and a preview allows only references to the
pages it leaves out.

Each test renders a two-page stage with the book's own ``build_html`` (jupyter-book's Sphinx
configuration, nitpicky), so the warnings are Sphinx's real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_companion.book import pipeline
from grpo_companion.book.pipeline import BookBuildError, BuildOptions

CONFIG = "title: probe\nexecute:\n  execute_notebooks: 'off'\n"


def _book(tmp_path: Path, intro: str, *, kept_in_preview: bool) -> BuildOptions:
    """A root whose toc has ``intro`` and ``gone``, staged with ``gone`` left out if asked."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root).mkdir()
    full_toc = "format: jb-book\nroot: intro\nchapters:\n  - file: gone\n"
    (root / "_toc.yml").write_text(full_toc)
    (root / "gone.md").write_text("(ch-gone)=\n# Gone\n\ntext\n")
    stage = out / "stage"
    stage.mkdir(parents=True)
    (stage / "_config.yml").write_text(CONFIG)
    (stage / "intro.md").write_text(f"# Intro\n\n{intro}\n")
    if kept_in_preview:
        (stage / "_toc.yml").write_text(full_toc)
        (stage / "gone.md").write_text((root / "gone.md").read_text())
    else:
        (stage / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    return BuildOptions(root=root, out=out, select=() if kept_in_preview else ("intro",))


def test_a_failed_build_fails_again(tmp_path):
    """Before: the second build re-read no page, so it emitted no warning and passed."""
    opts = _book(tmp_path, "See {ref}`no-such-label`.", kept_in_preview=True)
    for _ in range(2):
        with pytest.raises(BookBuildError, match="Sphinx reported errors"):
            pipeline.build_html(opts)


def test_a_preview_allows_references_to_the_pages_it_leaves_out(tmp_path, capsys):
    opts = _book(tmp_path, "See {ref}`ch-gone` and {doc}`gone`.", kept_in_preview=False)
    lines = []
    pipeline.build_html(opts, log=lines.append)
    # the one other line is the repository button's (links.resolve_repository: none here)
    assert [line for line in lines if "repository button" not in line] == [
        "   2 references point at pages this preview leaves out (shown as plain text)"]
    assert (opts.out / "html" / "intro.html").exists()


def test_a_preview_fails_on_any_other_warning_every_time(tmp_path, capsys):
    opts = _book(tmp_path, "See {ref}`ch-gone` and {ref}`a-typo`.", kept_in_preview=False)
    for _ in range(2):
        with pytest.raises(BookBuildError, match="1 warning"):
            pipeline.build_html(opts, log=lambda _: None)
        assert "a-typo" in capsys.readouterr().err


def test_split_warnings_and_left_out_targets():
    left_out = {"chapters/11_trl_run", "ch-calibration"}
    lines = ["x.ipynb:5: WARNING: undefined label: 'ch-calibration'",
             "x.ipynb:6: WARNING: unknown document: '/chapters/11_trl_run'",
             "x.ipynb:7: WARNING: undefined label: 'ch-typo'",
             "x.ipynb:8: ERROR: Unknown directive type: 'figur'",
             "a line of context"]
    expected, real = pipeline.split_warnings(lines, left_out)
    assert expected == lines[:2] and real == lines[2:4]
    targets = pipeline.left_out_targets(pipeline.REPO_ROOT, ["intro", "chapters/10_add_a_variant"])
    assert {"chapters/01_calibration", "ch-calibration", "chapters/11_trl_run"} <= targets
    assert "chapters/10_add_a_variant" not in targets
    assert {"fig-ch01-weights", "def-calibration"} <= targets  # a figure cell, a directive
