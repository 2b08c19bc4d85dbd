"""``python -m grpo_companion book / run-chapter``: options and errors."""

from __future__ import annotations

import json

import pytest

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


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_run_chapter_refuses_to_overwrite_its_source(tmp_path, capsys) -> None:
    src = tmp_path / "ch.md"
    text = _chapter("```{code-cell} ipython3\nprint(1)\n```\n")
    src.write_text(text)
    assert cli.main(["run-chapter", str(src), str(src)]) == 2
    assert "is the chapter source itself" in _one_line_error(capsys)
    assert src.read_text() == text
    assert cli.main(["run-chapter", str(src), str(tmp_path / "out.md")]) == 2
    assert "must be an .ipynb file" in _one_line_error(capsys)
    precious = tmp_path / "notes.ipynb"
    precious.write_text("my notes, not a notebook")
    assert cli.main(["run-chapter", str(src), str(precious)]) == 2
    assert "refusing to overwrite" in _one_line_error(capsys)
    assert precious.read_text() == "my notes, not a notebook"


def test_run_chapter_refuses_missing_folder_and_broken_sources(tmp_path, capsys) -> None:
    out = str(tmp_path / "out.ipynb")
    assert cli.main(["run-chapter", str(tmp_path / "nope.md"), out]) == 2
    assert "no such file" in _one_line_error(capsys)
    assert cli.main(["run-chapter", str(tmp_path), out]) == 2
    assert "is a folder" in _one_line_error(capsys)
    bad = tmp_path / "bad.md"
    bad.write_text("---\nkernelspec: [unclosed\n---\n# x\n")
    assert cli.main(["run-chapter", str(bad), out]) == 2
    assert "front matter is not valid YAML" in _one_line_error(capsys)
    plain = tmp_path / "plain.md"
    plain.write_text("# just markdown\n")
    assert cli.main(["run-chapter", str(plain), out]) == 2
    assert "not a notebook" in _one_line_error(capsys)
    assert not (tmp_path / "out.ipynb").exists()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("quick", "notabool", "must be a bool"),
    ("beta", "high", "must be a float"),
    ("gamma", "1", "has no parameter 'gamma'"),
    ("x=1;import os", "1", "not a Python identifier"),
    ("quick", "[unclosed", "not valid YAML"),
])
def test_run_chapter_checks_parameter_names_and_types(tmp_path, capsys, name, value,
                                                      message) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint(quick, beta)\n```\n")
                   .replace("quick = False", "quick = False\nbeta = 1.0"))
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out), "-p", name, value]) == 2
    assert message in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("beta", "-1", "parameter beta of "),
    ("beta", "-1", "beta must be > 0 and finite, got -1.0"),
    ("beta", ".nan", "beta must be a number, got nan"),
    ("p_ref", "1", "p_ref must be in (0, 1), got 1.0"),
    ("n_seeds", "0", "n_seeds must be an integer >= 1, or None for the chapter's default"),
    ("betas", "[0.1, -3]", "betas[1] must be > 0 and finite, got -3"),
])
def test_run_chapter_checks_the_range_of_a_scientific_parameter(tmp_path, capsys, name, value,
                                                                message) -> None:
    """The rules of grpo_companion.book.parameters refuse a value before any cell runs."""
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint(beta)\n```\n").replace(
        "quick = False", "quick = False\nbeta = 1.0\np_ref = 0.3\nn_seeds = None\n"
                         "betas = [0.1, 1.0]"))
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out), "-p", name, value]) == 2
    assert message in _one_line_error(capsys)
    assert not out.exists()


def test_a_size_parameter_takes_an_integer(tmp_path) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint('seeds', n_seeds or 5)\n```\n")
                   .replace("quick = False", "quick = False\nn_seeds = None"))
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out), "-p", "n_seeds", "3"]) == 0
    assert "seeds 3" in out.read_text()


def test_an_integer_is_accepted_for_a_float_parameter(tmp_path) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint(type(beta).__name__)\n```\n")
                   .replace("quick = False", "quick = False\nbeta = 1.0"))
    out = tmp_path / "out.ipynb"
    assert cli.main(["run-chapter", str(src), str(out), "-p", "beta", "2"]) == 0
    assert "float" in out.read_text()


def test_run_chapter_names_the_cell_that_times_out(tmp_path, capsys) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nx = 1\n```\n\n"
                            "```{code-cell} ipython3\nimport time\ntime.sleep(60)\n```\n"))
    assert cli.main(["run-chapter", str(src), str(tmp_path / "o.ipynb"),
                     "--cell-timeout", "3"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "CellTimeoutError" not in err, err
    assert "code cell 3" in err and "cell timeout of 3 s" in err and str(src) in err


def test_book_select_matching_nothing_lists_the_chapters(tmp_path, capsys) -> None:
    assert cli.main(["book", "--select", "no-such-chapter", "--out", str(tmp_path)]) == 2
    line = _one_line_error(capsys)
    assert "'no-such-chapter' matches no chapter" in line and "01_calibration" in line


def test_book_parameter_that_no_chapter_declares_is_refused(tmp_path, capsys) -> None:
    assert cli.main(["book", "-p", "nonsense", "1", "--out", str(tmp_path)]) == 2
    assert "no chapter of the book has a parameter named 'nonsense'" in _one_line_error(capsys)


def test_run_chapter_output_that_cannot_be_written_is_one_line(tmp_path, capsys) -> None:
    src = tmp_path / "ch.md"
    src.write_text(_chapter("```{code-cell} ipython3\nprint(1)\n```\n"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["run-chapter", str(src), str(blocker / "out.ipynb")]) == 2
    assert "cannot write" in _one_line_error(capsys)
