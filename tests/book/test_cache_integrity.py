"""The book cache reuses an executed notebook only while it matches the checksum
written with it: an edited cached notebook, or one whose outputs were deleted,
is executed again (defect: the cache had no content checksum)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from grpo_companion.book import pipeline
from grpo_companion.book.pipeline import BuildOptions, stage_documents

from .test_pipeline import _mini_book

BODY = "```{code-cell} ipython3\nprint(quick)\n```\n"


@pytest.fixture
def fake_run(monkeypatch) -> list[str]:
    """Replace the kernel by a fake that prints ``ran N`` in every code cell
    (the cache logic does not need a real kernel), and pin the library digest
    (other edits to the package would otherwise change the cache key)."""
    calls: list[str] = []

    def execute(nb, output_path, parameters, cwd, cell_timeout, source=None):
        calls.append(str(source))
        executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
        for cell in executed.cells:
            if cell.cell_type == "code":
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                       text=f"ran {len(calls)}\n")]
        executed.metadata[pipeline.DRAWN_KEY] = {}
        output_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, output_path)
        return pipeline.tag_for_the_book(executed)

    monkeypatch.setattr(pipeline, "execute_notebook", execute)
    monkeypatch.setattr(pipeline, "library_digest", lambda: "pinned library")
    return calls


def _stage(opts: BuildOptions, logged: list[str] | None = None):
    [result] = stage_documents(opts, log=(logged.append if logged is not None
                                          else lambda *_: None))
    return result


def _cached(opts: BuildOptions) -> Path:
    [cached] = opts.cache.glob("one-*.ipynb")
    return cached


def test_an_intact_cached_notebook_is_reused(tmp_path: Path, fake_run) -> None:
    opts = BuildOptions(root=_mini_book(tmp_path / "book", BODY), out=tmp_path / "out")
    assert not _stage(opts).cached
    assert _stage(opts).cached and len(fake_run) == 1
    assert "ran 1" in (opts.stage / "ch" / "one.ipynb").read_text()


def test_an_edited_cached_notebook_is_executed_again(tmp_path: Path, fake_run) -> None:
    opts = BuildOptions(root=_mini_book(tmp_path / "book", BODY), out=tmp_path / "out")
    _stage(opts)
    cached = _cached(opts)
    cached.write_text(cached.read_text().replace("ran 1", "forged output"))  # still valid JSON
    logged: list[str] = []
    result = _stage(opts, logged)
    assert not result.cached and len(fake_run) == 2
    staged = (opts.stage / "ch" / "one.ipynb").read_text()
    assert "forged output" not in staged and "ran 2" in staged
    assert any("checksum" in line for line in logged), logged
    assert "forged output" not in _cached(opts).read_text()
    assert _stage(opts).cached  # the new entry carries its own checksum


def test_a_cached_notebook_with_its_outputs_deleted_is_executed_again(tmp_path: Path,
                                                                      fake_run) -> None:
    opts = BuildOptions(root=_mini_book(tmp_path / "book", BODY), out=tmp_path / "out")
    _stage(opts)
    cached = _cached(opts)
    nb = nbformat.read(cached, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbformat.write(nb, cached)
    result = _stage(opts)
    assert not result.cached and len(fake_run) == 2
    assert "ran 2" in (opts.stage / "ch" / "one.ipynb").read_text()


def test_a_cached_notebook_without_its_checksum_is_executed_again(tmp_path: Path,
                                                                  fake_run) -> None:
    opts = BuildOptions(root=_mini_book(tmp_path / "book", BODY), out=tmp_path / "out")
    _stage(opts)
    for sidecar in opts.cache.glob("one-*.sha256"):
        sidecar.unlink()
    assert not _stage(opts).cached and len(fake_run) == 2
