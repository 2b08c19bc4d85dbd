"""The student edition (grpo_companion.book.student): solutions out, exercises kept, a starter
cell for each coding exercise, everything else unchanged."""

from __future__ import annotations

import ast

import nbformat
import pytest

from grpo_companion.book import student
from grpo_companion.cli import main

EXERCISE_PLAIN = """\
```{exercise}
:label: ex-plain

Show that $p(1-p) \\le 1/4$.
```"""
SOLUTION_PLAIN = """\
```{solution} ex-plain
:class: dropdown

Complete the square.
```"""
EXERCISE_CODE = """\
```{exercise}
:label: ex-code

Write `gains` and register it.
```"""
SOLUTION_CODE = """\
````{solution} ex-code
:class: dropdown

One way:

    import numpy as np
    from grpo_companion import theory

    def gains(succ, fail, n, cal, ops, s0=0.2):
        \"\"\"The gains.\"\"\"
        return fail / s0, succ / s0

    grid = np.linspace(0, 1, 5)
    theory.register_normalization("mine", gains)

```python
extra = 3
```
````"""


def _notebook() -> nbformat.NotebookNode:
    """A chapter in small: prose, code, a plain exercise, a coding one, and a gated one whose
    solution holds a code cell."""
    cells = [
        nbformat.v4.new_markdown_cell("# A chapter\n\nSome prose."),
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_markdown_cell(
            f"## Exercises\n\n{EXERCISE_PLAIN}\n\n{SOLUTION_PLAIN}\n\n{EXERCISE_CODE}\n\n"
            f"{SOLUTION_CODE}\n\nText after the exercises."),
        nbformat.v4.new_markdown_cell(
            "```{exercise-start}\n:label: ex-gated\n```\n\nTrain it.\n\n```{exercise-end}\n```"
            "\n\n```{solution-start} ex-gated\n:class: dropdown\n```\n\nLike this:"),
        nbformat.v4.new_code_cell("import torch\nmodel = torch.nn.Linear(2, 1)\nmodel(x)"),
        nbformat.v4.new_markdown_cell("```{solution-end}\n```\n\n## Summary\n\nDone."),
        nbformat.v4.new_code_cell("print(x)"),
    ]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


@pytest.fixture(scope="module")
def edition() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    nb = _notebook()
    return nb, student.student_notebook(nb)


def _text(nb: nbformat.NotebookNode) -> str:
    return "\n".join(cell.source for cell in nb.cells)


def test_every_solution_is_removed(edition) -> None:
    nb, out = edition
    assert student.count_directives(nb, "solution") == 3
    assert student.count_directives(out, "solution") == 0
    text = _text(out)
    for gone in ("Complete the square", "One way", "return fail / s0", "Like this",
                 "torch.nn.Linear", "solution-end", "extra = 3"):
        assert gone not in text


def test_every_exercise_is_kept_verbatim(edition) -> None:
    nb, out = edition
    assert student.count_directives(out, "exercise") == student.count_directives(nb, "exercise")
    text = _text(out)
    for kept in (EXERCISE_PLAIN, EXERCISE_CODE, "```{exercise-start}\n:label: ex-gated\n```",
                 "Train it.", "```{exercise-end}\n```"):
        assert kept in text


def test_a_starter_cell_after_each_coding_exercise(edition) -> None:
    _, out = edition
    starters = student.starter_cells(out)
    assert [c.metadata["grpo_companion"]["starter_for"] for c in starters] == ["ex-code",
                                                                               "ex-gated"]
    for cell in starters:  # right after its exercise
        before = out.cells[out.cells.index(cell) - 1].source
        assert before.rstrip().endswith("```") and "exercise" in before.split("\n```{")[-1]


def test_the_starter_keeps_imports_signatures_and_names(edition) -> None:
    _, out = edition
    code, gated = (c.source for c in student.starter_cells(out))
    assert code.splitlines()[0].startswith("# Exercise ex-code")
    assert "import numpy as np" in code and "from grpo_companion import theory" in code
    assert "def gains(succ, fail, n, cal, ops, s0=0.2):" in code
    assert "'The gains.'" in code or '"""The gains."""' in code
    assert "raise NotImplementedError('exercise ex-code')" in code
    assert "grid = ..." in code and "extra = ..." in code
    assert "register_normalization" not in code and "return" not in code
    assert "import torch" in gated and "model = ..." in gated and "model(x)" not in gated
    for source in (code, gated):  # valid Python that runs without error
        exec(compile(ast.parse(source), "<starter>", "exec"), {})


def test_nothing_else_changes(edition) -> None:
    nb, out = edition
    others = [c for c in out.cells if not student._is_starter(c)]
    assert others[0] == nb.cells[0] and others[1] == nb.cells[1]
    assert others[-1] == nb.cells[-1]
    assert others[2].source == (f"## Exercises\n\n{EXERCISE_PLAIN}\n\n{EXERCISE_CODE}")
    assert others[3].source == "Text after the exercises."
    assert others[4].source == ("```{exercise-start}\n:label: ex-gated\n```\n\nTrain it.\n\n"
                                "```{exercise-end}\n```")
    assert others[5].source == "## Summary\n\nDone."
    assert len(out.cells) == len(others) + 2 == 9
    assert out.metadata == nb.metadata
    assert len({c["id"] for c in out.cells}) == len(out.cells)
    nbformat.validate(out)


def test_the_input_is_not_modified(edition) -> None:
    nb, _ = edition
    fresh = _notebook()
    assert [(c.cell_type, c.source, c.metadata) for c in nb.cells] == \
        [(c.cell_type, c.source, c.metadata) for c in fresh.cells]


def test_a_notebook_without_exercises_is_unchanged() -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T\n\n```{note}\nx\n```"),
                                         nbformat.v4.new_code_cell("1")])
    assert student.student_notebook(nb).cells == nb.cells


@pytest.mark.parametrize("source, message", [
    ("```{solution} ex\nnever closed", "never closed"),
    ("```{solution}\n```", "no label"),
    ("```{solution} ex\n```\n\n```{solution} ex\n```", "two solutions"),
    ("```{solution-start} ex\n```\n\nno end", "no solution-end"),
])
def test_malformed_solutions_are_refused(source: str, message: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(source)])
    with pytest.raises(ValueError, match=message):
        student.student_notebook(nb)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="label"):
        student.starter_source("", ["x = 1"])
    with pytest.raises(ValueError, match="kind"):
        student.count_directives(_notebook(), "proof")


def test_code_that_is_not_python_keeps_a_placeholder() -> None:
    assert student.starter_source("ex", ["make pdf &&"]).splitlines()[1:] == ["..."]


def test_the_real_chapters(tmp_path) -> None:
    """Every chapter's exercises in, no solution out, one starter per coding exercise."""
    chapters = student.chapter_notebooks()
    assert len(chapters) >= 12
    written = {e.path.stem: e for e in student.write_student_edition(out=tmp_path)}
    assert sorted(written) == sorted(doc.split("/")[-1] for doc, _ in chapters)
    total_coding = 0
    for doc, nb in chapters:
        coding = sorted(label for label, code in student.solution_code(nb).items() if code)
        total_coding += len(coding)
        out = student.student_notebook(nb)  # (the written file: read once more, below)
        assert student.count_directives(out, "exercise") == student.count_directives(nb,
                                                                                     "exercise")
        assert student.count_directives(out, "solution") == 0
        assert "{solution" not in "\n".join(c.source for c in out.cells)
        assert sorted(c.metadata["grpo_companion"]["starter_for"]
                      for c in student.starter_cells(out)) == coding
        on_disk = nbformat.read(written[out_name(doc)].path, as_version=4)
        assert student.count_directives(on_disk, "solution") == 0
        assert written[out_name(doc)].exercises == student.count_directives(on_disk,
                                                                            "exercise") > 0
        assert written[out_name(doc)].starters == len(student.starter_cells(on_disk))
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert [c.source for c in out.cells if c.cell_type == "code"
                and not student._is_starter(c)] == code
    # chapters 5 (two grid searches) and 10 (a registered variant) hold code in solutions
    assert total_coding >= 3


def out_name(doc: str) -> str:
    return doc.split("/")[-1]


def test_the_command_line(tmp_path, capsys) -> None:
    assert main(["student", "--out", str(tmp_path / "student")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(list((tmp_path / "student").glob("*.ipynb"))) >= 12
    assert all("solutions removed" in line for line in lines)


def test_a_students_edited_notebook_is_kept(tmp_path, capsys) -> None:
    """Rerunning is harmless, an edited notebook is refused (one line, exit 2) and kept, and
    --overwrite replaces it. Without the check the edit was silently lost (shown once)."""
    out = tmp_path / "student"
    assert main(["student", "--out", str(out)]) == 0
    assert main(["student", "--out", str(out)]) == 0  # unchanged: rewritten, nothing lost
    edited = out / "06_finite_groups.ipynb"
    nb = nbformat.read(edited, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("my_answer = 42"))
    nbformat.write(nb, edited)
    mine = edited.read_bytes()
    capsys.readouterr()
    assert main(["student", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "06_finite_groups.ipynb" in err[0] and "--overwrite" in err[0]
    assert edited.read_bytes() == mine
    assert main(["student", "--out", str(out), "--overwrite"]) == 0
    assert "my_answer" not in edited.read_text()
