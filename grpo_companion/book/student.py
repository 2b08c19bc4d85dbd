"""The student edition: every chapter as a notebook with its exercises and without their
solutions, and a starter cell for each coding exercise.

The chapters write exercises and solutions with sphinx-exercise, either as one directive each
(a fenced ``{exercise}`` directive with a ``:label:``, and a fenced ``{solution} <label>``,
both inside a markdown cell; backtick or ``:::`` fences) or gated (``{exercise-start}`` ...
``{exercise-end}``, ``{solution-start} <label>`` ... ``{solution-end}``, with code cells
in between). :func:`student_notebook` removes every solution (for gated ones, the code cells
between start and end too) and leaves every other cell as it was; a markdown cell is only
split where a starter cell goes in.

**Which exercises are coding exercises.** One whose solution contains code: an indented code
block, a fenced block in Python, or a code cell of a gated solution.

**The starter cell** goes right after the exercise (:func:`starter_source`). It opens with a
comment naming the exercise and keeps, from the solution's code:

- its ``import`` lines, verbatim;
- every function and class it defines, with the signature (decorators, arguments, defaults,
  docstring) and the body replaced by ``raise NotImplementedError("exercise <label>")``;
- every top-level name it assigns, as ``name = ...``;

and leaves out everything else (calls, loops, expressions): what the student writes. Code
that is not valid Python keeps only the comment and a ``...``. A starter cell therefore runs
without error, so that "Run all" goes through a student notebook, and fails only when a
stubbed function is called. It carries the tag ``starter`` and the metadata
``grpo_companion.starter_for = <label>``.

**Why the sources.** The edition is made from the chapter sources converted by jupytext,
unexecuted, rather than from the executed notebooks: a student runs the chapter, so outputs
would only be stale copies; an executed notebook also holds papermill's injected parameters
cell and, for a gated solution, the outputs of the solution's own cells (the answer); and the
sources need no build, so ``make student`` takes seconds and gives the same notebooks on every
machine.
"""

from __future__ import annotations

import ast
import copy
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grpo_companion.book.pipeline import (
    REPO_ROOT,
    atomic_write,
    is_notebook_source,
    read_notebook,
    source_path,
    toc_documents,
)

STARTER_TAG = "starter"
METADATA_KEY = "grpo_companion"
#: the info strings of a fenced block that holds Python code
PYTHON_FENCES = ("python", "python3", "py", "ipython", "ipython3", "{code-cell}",
                 "{code-block} python", "{code-block} python3", "{code-block} ipython3",
                 "{code} python")
_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<kind>exercise|solution)(?P<gate>-start|-end)?\}"
                   r"\s*(?P<arg>\S*)\s*$")
_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})\s*(?P<info>.*?)\s*$")
_LABEL = re.compile(r"^:label:\s*(\S+)\s*$")


@dataclass(frozen=True)
class Directive:
    """One exercise or solution directive of a markdown cell.

    Parameters
    ----------
    kind : ``"exercise"`` or ``"solution"``.
    gate : ``""`` for a whole directive, ``"-start"`` or ``"-end"`` for a gated one.
    label : the exercise's ``:label:`` or the solution's argument (``""`` if none).
    start, stop : its lines in the cell, ``lines[start:stop]`` (fences included).
    body : the lines between its options and its closing fence.
    """

    kind: str
    gate: str
    label: str
    start: int
    stop: int
    body: tuple[str, ...]


@dataclass(frozen=True)
class StudentNotebook:
    """A written student notebook and what went into it."""

    path: Path
    exercises: int
    starters: int
    solutions_removed: int


def directives(lines: list[str]) -> list[Directive]:
    """The exercise and solution directives of a markdown cell's lines, in order.

    A directive ends at the first line made only of its fence character, at least as many
    times as it opened with (so a directive opened with four backticks may hold a fenced
    code block of three).
    Raises ``ValueError`` for a directive that is never closed.
    """
    found, i = [], 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if match is None:
            i += 1
            continue
        fence = match["fence"]
        close = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), None)
        if end is None:
            raise ValueError(f"lines: the {match['kind']} directive opened on line {i + 1} "
                             f"({lines[i].strip()!r}) is never closed")
        inner = lines[i + 1:end]
        options = 0
        while options < len(inner) and inner[options].startswith(":"):
            options += 1
        label = match["arg"]
        if match["kind"] == "exercise":
            label = next((m[1] for m in map(_LABEL.match, inner[:options]) if m), "")
        found.append(Directive(match["kind"], match["gate"] or "", label, i, end + 1,
                               tuple(inner[options:])))
        i = end + 1
    return found


def markdown_code(body: Iterable[str]) -> list[str]:
    """The code blocks of markdown text: indented blocks (four spaces or a tab, after a
    blank line) and fenced blocks whose info string names Python (:data:`PYTHON_FENCES`)."""
    lines, blocks, i = list(body), [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is not None:
            close = re.compile(rf"^{re.escape(fence['fence'][0])}{{{len(fence['fence'])},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])),
                       len(lines))
            if fence["info"].lower() in PYTHON_FENCES:
                blocks.append("\n".join(lines[i + 1:end]))
            i = end + 1
            continue
        indented = lines[i].startswith(("    ", "\t")) and lines[i].strip()
        if indented and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and (lines[end].startswith(("    ", "\t"))
                                        or not lines[end].strip()):
                end += 1
            blocks.append(textwrap.dedent("\n".join(lines[i:end])).strip("\n"))
            i = end
            continue
        i += 1
    return blocks


def _stub(node: ast.AST, label: str) -> ast.AST:
    """``node`` (a function or class definition) with its bodies replaced by a
    ``raise NotImplementedError("exercise <label>")`` (docstrings kept)."""
    node = copy.deepcopy(node)
    body = node.body
    doc = body[:1] if body and isinstance(body[0], ast.Expr) \
        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str) \
        else []
    if isinstance(node, ast.ClassDef):
        rest = [_stub(n, label) for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        node.body = doc + (rest or [ast.Expr(ast.Constant(...))])
    else:
        raise_ = ast.parse(f"raise NotImplementedError({f'exercise {label}'!r})").body
        node.body = doc + raise_
    return node


def starter_source(label: str, code: Iterable[str]) -> str:
    """The starter cell of a coding exercise, from the code blocks of its solution (the rule
    is in the module's docstring).

    Parameters
    ----------
    label : the exercise's label, named in the comment and in each ``NotImplementedError``.
    code : the solution's code blocks, each a piece of Python source.
    """
    if not label:
        raise ValueError("label: a coding exercise needs its label to name the starter cell")
    kept: list[str] = []
    for block in code:
        try:
            tree = ast.parse(textwrap.dedent(block))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                kept.append(ast.get_source_segment(textwrap.dedent(block), node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                kept.append(f"\n{ast.unparse(_stub(node, label))}\n")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                kept += [f"{name} = ..." for name in names if f"{name} = ..." not in kept]
    header = f"# Exercise {label}: your code here (this edition leaves the solution out)"
    body = "\n".join(kept or ["..."]).strip("\n").replace("\n\n\n", "\n\n")
    return f"{header}\n{body}"


def _is_starter(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and STARTER_TAG in cell.metadata.get("tags", [])


def solution_code(nb: nbformat.NotebookNode) -> dict[str, list[str]]:
    """Every solution's label and its code blocks (an empty list: a solution without code).

    Raises ``ValueError`` for a solution without a label, a gated solution that is never
    ended, or two solutions of one exercise.
    """
    code: dict[str, list[str]] = {}
    gated: str | None = None
    for cell in nb.cells:
        if cell.cell_type == "code":
            if gated is not None and cell.source.strip():
                code[gated].append(cell.source)
            continue
        if cell.cell_type != "markdown":
            continue
        lines = cell.source.splitlines()
        found = directives(lines)
        marks = [0, *(n for d in found for n in (d.start, d.stop)), len(lines)]
        outside = [lines[marks[k]:marks[k + 1]] for k in range(0, len(marks), 2)]
        for k, d in enumerate(found):
            if gated is not None and outside[k]:
                code[gated] += markdown_code(outside[k])
            if d.kind != "solution":
                continue
            if d.gate == "-end":
                gated = None
                continue
            if not d.label:
                raise ValueError("nb: a solution directive has no label (the exercise it "
                                 "solves)")
            if d.label in code:
                raise ValueError(f"nb: two solutions of exercise {d.label!r}")
            code[d.label] = markdown_code(d.body)
            if d.gate == "-start":
                gated = d.label
        if gated is not None and outside[-1]:
            code[gated] += markdown_code(outside[-1])
    if gated is not None:
        raise ValueError(f"nb: the gated solution of {gated!r} has no solution-end")
    return code


class _Pieces:
    """The markdown cells that one source cell becomes: its kept lines, cut where a starter
    cell goes in, appended to ``cells``."""

    def __init__(self, cell: nbformat.NotebookNode, cells: list[nbformat.NotebookNode]):
        self.cell, self.cells, self.text = cell, cells, []
        self.removed = False  # a solution was just cut out: join what follows with one blank

    def keep(self, chunk: list[str]) -> None:
        if self.removed:
            while chunk and not chunk[0].strip():
                chunk = chunk[1:]
            while self.text and not self.text[-1].strip():
                self.text.pop()
            if self.text:
                self.text.append("")
            self.removed = False
        self.text.extend(chunk)

    def flush(self) -> None:
        if "\n".join(self.text).strip():
            piece = copy.deepcopy(self.cell)
            piece.source = "\n".join(self.text).strip("\n")
            piece.pop("id", None)
            self.cells.append(piece)
        self.text = []


def student_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` without solutions and with a starter cell after each coding exercise
    (see the module's docstring). ``nb`` is not modified."""
    coding = {label for label, blocks in solution_code(nb).items() if blocks}
    out = copy.deepcopy(nb)
    cells: list[nbformat.NotebookNode] = []
    in_solution = False  # inside a gated solution
    gated_exercise = ""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            if not in_solution:
                cells.append(copy.deepcopy(cell))
            continue
        lines = cell.source.splitlines()
        found = directives(lines)
        starts = [d.label for d in found if d.kind == "exercise" and d.gate == "-start"]
        touched = in_solution or any(
            d.kind == "solution" or (d.kind == "exercise" and (d.label if d.gate != "-end" else (
                starts[-1] if starts else gated_exercise)) in coding) for d in found)
        if not touched:
            gated_exercise = starts[-1] if starts else gated_exercise
            cells.append(copy.deepcopy(cell))
            continue
        pieces = _Pieces(cell, cells)
        position = 0
        for d in found:
            if not in_solution:
                pieces.keep(lines[position:d.start])
            position = d.stop
            if d.kind == "solution":
                in_solution = d.gate == "-start"
                pieces.removed = True
                continue
            if in_solution:
                continue
            pieces.keep(lines[d.start:d.stop])
            if d.gate == "-start":
                gated_exercise = d.label
                continue
            label = gated_exercise if d.gate == "-end" else d.label
            if label in coding:
                pieces.flush()
                cells.append(nbformat.v4.new_code_cell(
                    starter_source(label, solution_code_of(nb, label)),
                    metadata={"tags": [STARTER_TAG], METADATA_KEY: {"starter_for": label}}))
        if not in_solution:
            pieces.keep(lines[position:])
        pieces.flush()
    out.cells = cells
    for index, cell in enumerate(out.cells):  # unique ids, as nbformat 4.5 requires
        if "id" not in cell:
            cell["id"] = f"student-{index}"
    return out


def solution_code_of(nb: nbformat.NotebookNode, label: str) -> list[str]:
    """The code blocks of the solution of exercise ``label`` (:func:`solution_code`)."""
    code = solution_code(nb)
    if label not in code:
        raise ValueError(f"label: no solution of exercise {label!r}; the solutions are of "
                         f"{', '.join(sorted(code)) or 'no exercise'}")
    return code[label]


def count_directives(nb: nbformat.NotebookNode, kind: str) -> int:
    """How many ``kind`` directives (``"exercise"`` or ``"solution"``; a gated one counted
    once, at its start) the markdown cells of ``nb`` hold."""
    if kind not in ("exercise", "solution"):
        raise ValueError(f"kind: 'exercise' or 'solution', got {kind!r}")
    return sum(d.kind == kind and d.gate != "-end"
               for cell in nb.cells if cell.cell_type == "markdown"
               for d in directives(cell.source.splitlines()))


def starter_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The starter cells of a student notebook."""
    return [cell for cell in nb.cells if _is_starter(cell)]


def chapter_notebooks(root: Path = REPO_ROOT) -> list[tuple[str, nbformat.NotebookNode]]:
    """Every notebook page of the table of contents that holds an exercise, as
    ``(document, notebook)``, read from its source by jupytext."""
    chapters = []
    for doc in toc_documents(root):
        src = source_path(root, doc)
        if not is_notebook_source(src):
            continue
        nb = read_notebook(src)
        if count_directives(nb, "exercise"):
            chapters.append((doc, nb))
    return chapters


def _same_cells(path: Path, nb: nbformat.NotebookNode) -> bool:
    """Whether the notebook at ``path`` holds ``nb``'s cells (cell ids aside: jupytext gives
    new random ones at every conversion)."""
    try:
        old = nbformat.reads(path.read_text(), as_version=4)
    except (OSError, ValueError, UnicodeDecodeError):
        return False

    def cells(notebook):
        return [(c.cell_type, c.source, c.get("metadata", {})) for c in notebook.cells]

    return cells(old) == cells(nb)


def write_student_edition(root: Path = REPO_ROOT,
                          out: Path = REPO_ROOT / "_build" / "student",
                          overwrite: bool = False) -> list[StudentNotebook]:
    """Write ``<out>/<chapter>.ipynb`` for every chapter with exercises (atomically; other
    files in ``out`` are left alone) and return what each holds.

    A student works in these notebooks, so one that already exists and differs from what
    would be written is kept: ``ValueError`` names it, and nothing is written, unless
    ``overwrite`` is true. An identical one is rewritten (nothing is lost)."""
    out = Path(out)
    editions = []
    for doc, nb in chapter_notebooks(root):
        student = student_notebook(nb)
        editions.append((out / f"{Path(doc).name}.ipynb", nb, student,
                         nbformat.writes(student).encode()))
    changed = [path for path, _, student, _ in editions
               if path.exists() and not _same_cells(path, student)]
    if changed and not overwrite:
        raise ValueError(f"{changed[0]} exists and differs from the student edition (edited?); "
                         f"{len(changed)} such file(s) kept: move them, or pass overwrite "
                         "(--overwrite) to replace them")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path, nb, student, data in editions:
        atomic_write(path, data)
        written.append(StudentNotebook(path, count_directives(student, "exercise"),
                                       len(starter_cells(student)),
                                       count_directives(nb, "solution")))
    return written
