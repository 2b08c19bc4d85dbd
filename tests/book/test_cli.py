"""``python -m grpo_companion book / run-chapter``: options and errors."""

from __future__ import annotations

import json

from grpo_companion import cli

from .test_pipeline import _chapter


def test_bad_cell_timeout_is_refused(capsys) -> None:
    assert cli.main(["book", "--cell-timeout", "0"]) == 2
    assert "--cell-timeout must be > 0" in capsys.readouterr().err


def test_run_chapter_passes_parameters_and_writes_the_notebook(tmp_path) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint(quick, beta)\n```\n")
                   .replace("quick = False", "quick = False\nbeta = 1.0"))
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out), "-p", "beta", "0.5",
                     "-p", "quick", "true"]) == 0
    outputs = [o for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])]
    assert any("True 0.5" in "".join(o.get("text", "")) for o in outputs)


def test_run_chapter_reports_a_failing_cell(tmp_path, capsys) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nraise RuntimeError('boom')\n```\n"))
    assert cli.main(["run-chapter", str(src), str(tmp_path / "out.ipynb")]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "cell" in err
