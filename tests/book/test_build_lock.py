"""One build at a time per output folder: a second ``book`` into a folder that
another build holds exits with one line and status 2, two builds started
together into a fresh folder never crash, and the MathJax copy is atomic."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_companion import cli
from grpo_companion.book import pipeline
from grpo_companion.book.pipeline import BuildOptions, UsageError, stage_documents

from .test_cli import _one_line_error
from .test_pipeline import _mini_book

BODY = "```{code-cell} ipython3\nprint(quick)\n```\n"

# a `book` command on a mini book, with the kernel and Sphinx replaced by fakes; it
# waits for the test's signal so that two of them start at the same moment
RACER = """
import json, os, sys, time, types
from functools import partial
from pathlib import Path
import nbformat
# the `train` subcommand's options import torch (seconds); this book command needs none
sys.modules["grpo_companion.rl.cli"] = types.SimpleNamespace(add_train_arguments=print)
from grpo_companion import cli
from grpo_companion.book import pipeline

root, out, ready, go = map(Path, sys.argv[1:5])

def execute(nb, output_path, parameters, cwd, cell_timeout, source=None):
    time.sleep(0.2)
    executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    executed.metadata[pipeline.DRAWN_KEY] = {}
    output_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(executed, output_path)
    return pipeline.tag_for_the_book(executed)

pipeline.execute_notebook = execute
pipeline.library_digest = lambda: "pinned library"
pipeline.build_html = lambda opts, **_: None
pipeline.BuildOptions = partial(pipeline.BuildOptions, root=root)
pipeline.mathjax_source_dir()
ready.touch()
while not go.exists():
    time.sleep(0.001)
sys.exit(cli.main(["book", "--quick", "--out", str(out)]))
"""


@pytest.fixture
def fake_book(tmp_path, monkeypatch) -> Path:
    root = _mini_book(tmp_path / "book", BODY)

    def execute(nb, output_path, parameters, cwd, cell_timeout, source=None):
        import nbformat

        executed = nbformat.from_dict(json.loads(nbformat.writes(nb)))
        executed.metadata[pipeline.DRAWN_KEY] = {}
        output_path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, output_path)
        return pipeline.tag_for_the_book(executed)

    monkeypatch.setattr(pipeline, "execute_notebook", execute)
    monkeypatch.setattr(pipeline, "library_digest", lambda: "pinned library")
    monkeypatch.setattr(pipeline, "build_html", lambda opts, **_: None)
    monkeypatch.setattr(pipeline, "BuildOptions", functools.partial(BuildOptions, root=root))
    return root


def _hold_lock(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / ".build.lock", os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_second_build_into_a_held_folder_exits_2_with_one_line(tmp_path, capsys,
                                                                 fake_book) -> None:
    out = tmp_path / "out"
    fd = _hold_lock(out)
    try:
        assert cli.main(["book", "--quick", "--out", str(out)]) == 2
        line = _one_line_error(capsys)
        assert "another build" in line and str(out) in line
        assert not (out / "stage").exists() and not (out / "cache").exists()
        with pytest.raises(UsageError, match="another build"):
            stage_documents(BuildOptions(root=fake_book, out=out), log=lambda *_: None)
    finally:
        os.close(fd)
    assert cli.main(["book", "--quick", "--out", str(out)]) == 0  # free again
    capsys.readouterr()


def test_two_builds_started_together_into_a_fresh_folder_do_not_crash(tmp_path) -> None:
    root = _mini_book(tmp_path / "book", BODY)
    out, go = tmp_path / "out", tmp_path / "go"
    procs = []
    for i in range(2):
        ready = tmp_path / f"ready-{i}"
        procs.append((ready, subprocess.Popen(
            [sys.executable, "-c", RACER, str(root), str(out), str(ready), str(go)],
            cwd=pipeline.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)))
    deadline = time.monotonic() + 60
    while not all(ready.exists() for ready, _ in procs):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    results = [(proc.wait(timeout=120), proc.communicate()[1]) for _, proc in procs]
    for code, err in results:
        assert "Traceback" not in err, err
        assert code in (0, 2), err
        if code == 2:
            lines = [line for line in err.splitlines() if line.strip()]
            assert len(lines) == 1 and "another build" in lines[0], err
    assert 0 in [code for code, _ in results]
    mathjax = out / "stage" / "_static" / "mathjax"
    source = pipeline.mathjax_source_dir()
    assert (mathjax / ".source").read_text() == str(source)
    assert sorted(p.relative_to(mathjax) for p in mathjax.rglob("*") if p.name != ".source") \
        == sorted(p.relative_to(source) for p in source.rglob("*"))
    assert (out / "stage" / "ch" / "one.ipynb").exists()


def test_a_partial_mathjax_copy_is_replaced_whole(tmp_path) -> None:
    stage = tmp_path / "stage"
    partial = stage / "_static" / "mathjax"
    (partial / "input").mkdir(parents=True)
    (partial / "tex-chtml.js").write_text("trunc")
    (partial / "input" / "tex").write_text("a file where the bundle has a folder")
    pipeline.stage_mathjax(stage)
    source = pipeline.mathjax_source_dir()
    assert (partial / "tex-chtml.js").read_bytes() == (source / "tex-chtml.js").read_bytes()
    assert (partial / "input" / "tex").is_dir()
    assert sorted(p.name for p in (stage / "_static").iterdir()) == ["mathjax"]
