"""``run-chapter`` never writes into its source (a hard link included), keeps
its scratch files in a private folder, and replaces the output only with a
complete notebook (an interrupted run leaves the earlier output)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jupytext
import nbformat

from grpo_companion import cli
from grpo_companion.book.pipeline import REPO_ROOT

from .test_cli import _one_line_error
from .test_pipeline import _chapter


def test_run_chapter_refuses_an_output_hard_linked_to_its_source(tmp_path, capsys) -> None:
    src = tmp_path / "ch.ipynb"
    jupytext.write(jupytext.reads(_chapter("```{code-cell} ipython3\nprint(1)\n```\n"),
                                  fmt="md:myst"), src)
    before = src.read_bytes()
    out = tmp_path / "out.ipynb"
    os.link(src, out)
    assert cli.main(["run-chapter", str(src), str(out)]) == 2
    assert "is the chapter source itself" in _one_line_error(capsys)
    assert src.read_bytes() == before and os.path.samefile(src, out)


def test_run_chapter_leaves_a_file_with_its_old_scratch_name_alone(tmp_path) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint('hello')\n```\n"))
    mine = tmp_path / ".out.input.ipynb"  # the name the scratch input used to get
    mine.write_text("the user's own file")
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out)]) == 0
    assert mine.read_text() == "the user's own file"
    assert "hello" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.input.ipynb", "ch.md",
                                                          "out.ipynb"]
    assert (out.stat().st_mode & 0o777) == (0o666 & ~_umask())  # as a plain write makes it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ``python -m grpo_companion`` without the `train` subcommand's options (they import torch)
RUN_CHAPTER = """
import sys, types
sys.modules["grpo_companion.rl.cli"] = types.SimpleNamespace(add_train_arguments=print)
from grpo_companion import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_an_interrupted_run_chapter_keeps_the_earlier_output(tmp_path) -> None:
    started = tmp_path / "started"
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nimport time\n"
                            f"open({str(started)!r}, 'w').close()\ntime.sleep(120)\n```\n"))
    out = tmp_path / "out.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("the earlier, complete output")]
    nbformat.write(nb, out)
    earlier = out.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", RUN_CHAPTER, "run-chapter", str(src),
                             str(out)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # the slow cell is running: papermill saved its output
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the chapter never started"
            time.sleep(0.1)
        time.sleep(0.5)
        assert out.read_bytes() == earlier  # nothing half-executed in place of the output
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert out.read_bytes() == earlier
    assert "".join(json.loads(out.read_text())["cells"][0]["source"]) \
        == "the earlier, complete output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ch.md", "out.ipynb", "started"]
