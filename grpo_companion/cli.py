"""Command line: ``python -m grpo_companion {book,pdf,student,run-chapter,train,diagnose} ...``.

- ``book`` executes every chapter (cached) and renders the HTML book.
- ``pdf`` renders the same executed book as one PDF (see :mod:`grpo_companion.book.pdf`).
- ``student`` writes the chapters as notebooks without the exercises' solutions
  (see :mod:`grpo_companion.book.student`).
- ``run-chapter`` executes one chapter source with other parameters.
- ``train`` runs a toy GRPO training (see :mod:`grpo_companion.rl.cli`).
- ``diagnose`` says what the theory predicts for a TRL ``GRPOConfig`` on your prompts
  (see :mod:`grpo_companion.practice.diagnose`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml


def _add_parameter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
        help="notebook parameter (value parsed as YAML, as papermill -p does); repeatable",
    )


def build_parser() -> argparse.ArgumentParser:
    from grpo_companion.book.pipeline import REPO_ROOT

    parser = argparse.ArgumentParser(prog="python -m grpo_companion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    book = sub.add_parser("book", help="execute the chapters and build the HTML book")
    book.add_argument("--quick", action="store_true",
                      help="run every notebook with quick=True (small sizes, as CI does)")
    book.add_argument("--out", type=Path, default=REPO_ROOT / "_build",
                      help="build directory; the HTML lands in OUT/html (default: _build)")
    book.add_argument("--cell-timeout", type=int, default=900,
                      help="seconds one cell may run before the build fails (default: 900)")
    book.add_argument("--select", action="append", default=[], metavar="TEXT",
                      help="partial book for previewing: keep only the chapters whose file "
                           "name contains TEXT (plus the root and plain pages); repeatable")
    _add_parameter_option(book)

    pdf = sub.add_parser("pdf", help="build the whole executed book as one PDF (XeLaTeX)")
    pdf.add_argument("--quick", action="store_true",
                     help="run every notebook with quick=True (small sizes, as CI does)")
    pdf.add_argument("--out", type=Path, default=REPO_ROOT / "_build",
                     help="build directory shared with `book` (its executed notebooks are "
                          "reused); the PDF lands in OUT/pdf/book.pdf (default: _build)")
    pdf.add_argument("--from-build", type=Path, default=None, metavar="DIR",
                     help="take the staged, executed notebooks of the book built in DIR "
                          "(e.g. _build) instead of executing the chapters")
    pdf.add_argument("--cell-timeout", type=int, default=900,
                     help="seconds one cell may run before the build fails (default: 900)")
    _add_parameter_option(pdf)

    student = sub.add_parser("student", help="write the chapters as notebooks with the "
                                             "solutions removed and starter cells")
    student.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "student",
                         help="folder for the notebooks (default: _build/student)")
    student.add_argument("--overwrite", action="store_true",
                         help="replace student notebooks that were edited since they were "
                              "written (refused by default: a student's work is kept)")

    run = sub.add_parser("run-chapter", help="execute one chapter source into a notebook")
    run.add_argument("source", type=Path, help="chapter source, e.g. chapters/05_dynamics.md")
    run.add_argument("output", type=Path, help="executed notebook to write (.ipynb)")
    run.add_argument("--cell-timeout", type=int, default=900)
    _add_parameter_option(run)

    # listed here; its options are derived from TrainConfig by tyro (grpo_companion.rl.cli),
    # which main() hands the arguments after "train" to
    sub.add_parser("train", help="train a toy policy with GRPO (train --help: its options)",
                   add_help=False)

    diag = sub.add_parser(
        "diagnose", help="what the theory predicts for a TRL GRPOConfig on your prompts",
        description="Print, for a trl.GRPOConfig and your prompts' reference success rates, "
                    "the expected share of zero-variance groups (frac_reward_zero_std), where "
                    "each prompt settles and how fast, which prompts cannot move at this "
                    "group size, and the settings the theory does not cover; write a plot.")
    diag.add_argument("--config", type=Path, required=True,
                      help="JSON object of GRPOConfig fields (the rest: TRL's defaults)")
    diag.add_argument("--p-ref", type=Path, required=True, dest="p_ref",
                      help="CSV of reference success rates: one column, or a column named "
                           "p_ref")
    diag.add_argument("--plot", type=Path, default=Path("diagnosis.png"),
                      help="PNG to write (default: diagnosis.png); never overwritten unless "
                           "--overwrite")
    diag.add_argument("--rounds", type=int, default=None,
                      help="groups of each prompt the run draws (default: from max_steps)")
    diag.add_argument("--overwrite", action="store_true", help="replace an existing --plot")
    return parser


def run_diagnose(args: argparse.Namespace) -> int:
    """``diagnose``: print the table and write the plot; 2 with a one-line error on bad input."""
    if args.plot.suffix.lower() != ".png":
        print(f"error: --plot must name a .png file, got {args.plot}", file=sys.stderr)
        return 2
    if args.plot.exists() and not args.overwrite:
        print(f"error: --plot {args.plot} exists; pass --overwrite or choose another path",
              file=sys.stderr)
        return 2
    if not args.plot.parent.is_dir():
        print(f"error: --plot {args.plot}: the folder {args.plot.parent} does not exist",
              file=sys.stderr)
        return 2
    try:
        from grpo_companion.practice.diagnose import diagnose
        from grpo_companion.practice.trl_facts import TRLNotInstalledError

        result = diagnose(args.config, args.p_ref, rounds=args.rounds)
    except TRLNotInstalledError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}".splitlines()[0], file=sys.stderr)
        return 2
    print(result.table(max_rows=10_000))
    from grpo_companion.files import write_atomically

    figure = result.figure()
    try:
        write_atomically(args.plot, lambda f: figure.savefig(f, format="png", dpi=110),
                         prefix=f".{args.plot.name}.", suffix=".tmp", text=False)
    except OSError as err:
        print(f"error: cannot write {args.plot}: {err.strerror}", file=sys.stderr)
        return 2
    print(f"plot: {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        from grpo_companion.rl.cli import PROG, run_train

        return run_train(argv[1:], PROG)
    args = build_parser().parse_args(argv)
    if args.command == "diagnose":
        return run_diagnose(args)
    if args.command == "student":
        return run_student(args)

    from grpo_companion.book.pipeline import (
        BookBuildError,
        BuildOptions,
        UsageError,
        build,
    )

    if args.cell_timeout <= 0:
        print(f"error: --cell-timeout must be > 0, got {args.cell_timeout}", file=sys.stderr)
        return 2
    try:
        params = _parameter(args.parameter)
        if args.command == "book":
            opts = BuildOptions(out=args.out.resolve(), quick=args.quick, parameters=params,
                                cell_timeout=args.cell_timeout, select=tuple(args.select))
            build(opts)
        elif args.command == "pdf":
            from grpo_companion.book.pdf import build_pdf

            opts = BuildOptions(out=args.out.resolve(), quick=args.quick, parameters=params,
                                cell_timeout=args.cell_timeout)
            build_pdf(opts, from_build=args.from_build)
        else:
            run_chapter(args.source, args.output, params, args.cell_timeout)
            print(f"executed {args.source} -> {args.output}")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BookBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # e.g. an output folder that cannot be created or written
        print(f"error: cannot write {err.filename or 'the output'}: {err.strerror}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


def run_student(args: argparse.Namespace) -> int:
    """``student``: write the student notebooks; 2 with a one-line error on bad input."""
    from grpo_companion.book.student import write_student_edition

    try:
        written = write_student_edition(out=args.out, overwrite=args.overwrite)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot write {err.filename or args.out}: {err.strerror}", file=sys.stderr)
        return 2
    for edition in written:
        print(f"{edition.path}: {edition.exercises} exercises, {edition.starters} starter "
              f"cells, {edition.solutions_removed} solutions removed")
    return 0


def run_chapter(source: Path, output: Path, params: dict[str, object], cell_timeout: int) -> None:
    """Execute one chapter source into ``output`` as the book build does.

    Refuses (with :class:`~grpo_companion.book.pipeline.UsageError`) an output
    that is the source itself (the same file by any name: a symbolic or hard
    link included), is not ``.ipynb``, or is an existing file that is not a
    notebook, and parameters the chapter does not declare or whose type differs
    from the default's. The output is replaced atomically once the chapter has
    run (see :func:`~grpo_companion.book.pipeline.execute_notebook`): an
    interrupted run leaves an earlier output as it was.
    """
    from grpo_companion.book.pipeline import (
        UsageError,
        execute_notebook,
        notebook_parameters_for,
        read_notebook,
    )

    nb = read_notebook(source)
    if _same_file(output, source):
        raise UsageError(f"the output {output} is the chapter source itself; "
                         "give another path ending in .ipynb")
    if output.suffix != ".ipynb":
        raise UsageError(f"the output {output} must be an .ipynb file")
    if output.is_dir():
        raise UsageError(f"the output {output} is a folder")
    if output.exists():
        try:
            json.loads(output.read_text())["cells"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise UsageError(f"{output} exists and is not a notebook; "
                             "refusing to overwrite it") from None
    params = notebook_parameters_for(nb, {"quick": False, **params}, str(source))
    execute_notebook(nb, output.resolve(), params, cwd=source.resolve().parent,
                     cell_timeout=cell_timeout, source=source)


def _same_file(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file (same device and inode), or the
    same path where one of them does not exist yet."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _parameter(pairs: list[list[str]] | None) -> dict[str, object]:
    """``-p NAME VALUE`` pairs, values parsed as YAML like papermill's ``-p``."""
    from grpo_companion.book.pipeline import UsageError

    out: dict[str, object] = {}
    for name, value in pairs or []:
        try:
            out[name] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UsageError(f"-p {name}: the value {value!r} is not valid YAML") from None
    return out


if __name__ == "__main__":
    raise SystemExit(main())
