"""Command line: ``python -m grpo_companion {book,run-chapter,train} ...``.

- ``book`` executes every chapter (cached) and renders the HTML book.
- ``run-chapter`` executes one chapter source with other parameters.
- ``train`` runs a toy GRPO training (see :mod:`grpo_companion.rl.cli`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml


def _parameter(pairs: list[list[str]] | None) -> dict[str, object]:
    """``-p NAME VALUE`` pairs, values parsed as YAML like papermill's ``-p``."""
    return {name: yaml.safe_load(value) for name, value in (pairs or [])}


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

    run = sub.add_parser("run-chapter", help="execute one chapter source into a notebook")
    run.add_argument("source", type=Path, help="chapter source, e.g. chapters/05_dynamics.md")
    run.add_argument("output", type=Path, help="executed notebook to write (.ipynb)")
    run.add_argument("--cell-timeout", type=int, default=900)
    _add_parameter_option(run)

    train = sub.add_parser("train", help="train a toy policy with GRPO",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    from grpo_companion.rl.cli import add_train_arguments

    add_train_arguments(train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        from grpo_companion.rl.cli import run_train

        return run_train(args)

    from grpo_companion.book.pipeline import (
        BookBuildError,
        BuildOptions,
        build,
        execute_notebook,
        read_notebook,
    )

    if args.cell_timeout <= 0:
        print(f"error: --cell-timeout must be > 0, got {args.cell_timeout}", file=sys.stderr)
        return 2
    params = _parameter(args.parameter)
    try:
        if args.command == "book":
            opts = BuildOptions(out=args.out.resolve(), quick=args.quick, parameters=params,
                                cell_timeout=args.cell_timeout, select=tuple(args.select))
            build(opts)
        else:
            nb = read_notebook(args.source)
            execute_notebook(nb, args.output.resolve(), {"quick": False, **params},
                             cwd=args.source.resolve().parent, cell_timeout=args.cell_timeout)
            print(f"executed {args.source} -> {args.output}")
    except BookBuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
