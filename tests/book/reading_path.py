"""What a reader meets in a chapter's source, checked without building (issue 25, item 3).

:func:`problems` lists every way a MyST notebook breaks the book's reading conventions:

* a chapter opens with one ``{admonition}`` of class ``chapter-opening`` before its parameters
  cell, with the paragraphs "What you will see." and "What you need.", naming every parameter
  of the parameters cell in backticks (so the folded cell is discoverable);
* it has a ``## Summary`` section of at least three bullets, followed by nothing but
  ``## Exercises``;
* a code cell the reader sees (no ``remove-*``/``hide-*`` tag) holds no ``glue(`` call and no
  ``assert``: checks and bookkeeping are folded (``hide-input``) or live in tested functions;
* the parameters cell is folded or removed, and each name it declares has a rule in
  :mod:`grpo_companion.book.parameters` that accepts its default.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext

from grpo_companion.book import parameters
from grpo_companion.book.pipeline import PARAMETERS_TAG, declared_parameters

HIDING_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
OPENING = re.compile(r"^(`{3,}|:{3,})\{admonition\}[^\n]*\n(?P<body>.*?)^\1\s*$",
                     re.M | re.S)
FENCE = re.compile(r"^(`{3,}|:{3,})")


def _headings(markdown: str) -> list[str]:
    """The ``## `` headings of a Markdown cell, outside fenced blocks."""
    out, fence = [], None
    for line in markdown.splitlines():
        match = FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None and len(line.strip()) > len(marker):
                fence = marker  # an opening fence carries a language or directive
            elif fence is not None and line.strip() == fence:
                fence = None
            continue
        if fence is None and line.startswith("## "):
            out.append(line[3:].strip())
    return out


def _opening_box(cells) -> str | None:
    """The body of the ``chapter-opening`` admonition before the parameters cell, if any."""
    for cell in cells:
        if cell.cell_type == "code" and PARAMETERS_TAG in cell.metadata.get("tags", []):
            return None
        if cell.cell_type == "markdown":
            for match in OPENING.finditer(cell.source):
                if re.search(r"^:class:.*\bchapter-opening\b", match.group("body"), re.M):
                    return match.group("body")
    return None


def _summary_bullets(cells) -> int | None:
    """Bullets of the ``## Summary`` section (None when there is none)."""
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    match = re.search(r"^## Summary\s*$(?P<body>.*?)(?=^## |\Z)", text, re.M | re.S)
    if not match:
        return None
    return len(re.findall(r"^[-*] ", match.group("body"), re.M))


def problems(path: Path, *, chapter: bool = True) -> list[str]:
    """Everything in ``path`` (a MyST notebook) that breaks the conventions above.

    ``chapter`` False checks only the code cells and the parameters cell (pages such as the
    ledger or the paper index have no opening box or summary).
    """
    nb = jupytext.read(path)
    cells = nb.cells
    found: list[str] = []
    param_cells = [c for c in cells if PARAMETERS_TAG in c.metadata.get("tags", [])]
    if len(param_cells) != 1:
        return [f"{len(param_cells)} parameters cells (one expected)"]
    declared = declared_parameters(nb)
    if not set(param_cells[0].metadata.get("tags", [])) & HIDING_TAGS:
        found.append("the parameters cell is shown (tag it hide-input)")
    for name, default in declared.items():
        if parameters.rule_for(name) is None:
            found.append(f"parameter {name} has no rule in grpo_companion.book.parameters")
            continue
        try:
            parameters.check_value(name, default)
        except ValueError as err:
            found.append(f"parameter {name}'s default is refused by its rule: {err}")
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or set(cell.metadata.get("tags", [])) & HIDING_TAGS:
            continue
        for line in cell.source.splitlines():
            if "glue(" in line or line.lstrip().startswith("assert"):
                found.append(f"cell {i} shows a check or glue call: {line.strip()[:60]}")
    if not chapter:
        return found
    box = _opening_box(cells)
    if box is None:
        found.append("no chapter-opening admonition before the parameters cell")
    else:
        for words in ("What you will see.", "What you need."):
            if words not in box:
                found.append(f"the opening box has no '{words}'")
        for name in declared:
            if f"`{name}`" not in box:
                found.append(f"the opening box does not name parameter `{name}`")
    headings = [h for c in cells if c.cell_type == "markdown" for h in _headings(c.source)]
    if "Summary" not in headings:
        found.append("no '## Summary' section")
    else:
        after = headings[len(headings) - headings[::-1].index("Summary"):]
        if set(after) - {"Exercises"}:
            found.append(f"sections after the summary: {after}")
        bullets = _summary_bullets(cells)
        if bullets is not None and bullets < 3:
            found.append(f"the summary has {bullets} bullets (3 or more expected)")
    return found
