"""How much code each chapter notebook holds: ``python scripts/notebook_code_lines.py [--json]``.

Standard library only. For every ``chapters/*.md`` (MyST-markdown notebooks, jupytext) it
counts, over the ``{code-cell}`` blocks only,

``code_lines``
    non-blank lines of code, leaving out each cell's metadata: the ``:key: value`` lines at
    the top of a cell and a ``---`` ... ``---`` YAML block at its top;
``defs``
    ``def`` statements (``async def`` included; nested ones count too), the measure of how
    much reusable logic a chapter still defines instead of calling from the library
    (issue 22: chapters state, derive, compute with library calls and show);
``cells``
    the number of code cells.

Prints a table with a total row, or with ``--json`` one JSON object
``{"chapters": {name: {...}}, "total": {...}}``. ``--chapters DIR`` reads another folder.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_OPEN = re.compile(r"^(`{3,}|~{3,})\{code-cell\}")
_DEF = re.compile(r"^\s*(async\s+)?def\s+\w+")
_META = re.compile(r"^:[\w-]+:")


def _cells(text: str) -> list[list[str]]:
    """The bodies of the ``{code-cell}`` blocks of one MyST notebook, metadata removed."""
    cells: list[list[str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(1)
        body: list[str] = []
        i += 1
        closing = re.compile(rf"^{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while i < len(lines) and not closing.match(lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        # metadata at the top of the cell: a YAML block, or :key: value lines
        if body and body[0].strip() == "---":
            end = next((j for j in range(1, len(body)) if body[j].strip() == "---"), None)
            if end is not None:
                body = body[end + 1 :]
        else:
            k = 0
            while k < len(body) and _META.match(body[k]):
                k += 1
            body = body[k:]
        cells.append(body)
    return cells


def count(path: Path) -> dict[str, int]:
    """``code_lines``, ``defs`` and ``cells`` of one chapter file (see the module docstring)."""
    cells = _cells(path.read_text(encoding="utf-8"))
    code = [line for cell in cells for line in cell if line.strip()]
    return {
        "code_lines": len(code),
        "defs": sum(1 for line in code if _DEF.match(line)),
        "cells": len(cells),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--chapters",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "chapters",
        help="folder of MyST notebooks (default: the book's chapters/)",
    )
    args = parser.parse_args(argv)
    files = sorted(args.chapters.glob("*.md"))
    if not files:
        print(f"no *.md files in {args.chapters}", file=sys.stderr)
        return 1
    rows = {f.stem: count(f) for f in files}
    total = {key: sum(r[key] for r in rows.values()) for key in ("code_lines", "defs", "cells")}
    if args.json:
        print(json.dumps({"chapters": rows, "total": total}, indent=2))
        return 0
    width = max(len(name) for name in [*rows, "total"])
    print(f"{'chapter':<{width}}  {'code lines':>10}  {'defs':>4}  {'cells':>5}")
    for name, r in [*rows.items(), ("total", total)]:
        print(f"{name:<{width}}  {r['code_lines']:>10}  {r['defs']:>4}  {r['cells']:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
