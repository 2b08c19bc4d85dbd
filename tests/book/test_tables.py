"""Tables that cells display as Markdown reach the reader as tables, not as rows of pipes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+\s*$", re.M)  # |---|---| of a Markdown table
#: Pages whose cells display Markdown tables when this check was written: a floor.
MIN_TABLE_OUTPUTS = 8


def markdown_tables(notebook: Path) -> int:
    """Tables in the ``text/markdown`` outputs of an executed notebook."""
    count = 0
    for cell in json.loads(notebook.read_text())["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/markdown", "")
            text = "".join(text) if isinstance(text, list) else text
            count += len(SEPARATOR.findall(text))
    return count


def visible_text(html: str) -> str:
    """The page without code blocks, scripts and tags (what reads as prose and output)."""
    html = re.sub(r"<(pre|script|style|code)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", "\n", html)


def test_markdown_tables_render_as_tables(html_dir: Path, toc_pages: list[str]):
    exec_dir = html_dir.parent / "exec"
    expected_total = 0
    for page in toc_pages:
        notebook = exec_dir / page.replace(".html", ".ipynb")
        if not notebook.exists():
            continue
        expected = markdown_tables(notebook)
        expected_total += expected
        html = (html_dir / page).read_text()
        assert html.count("<table") >= expected, (
            f"{page}: {expected} Markdown tables displayed by cells, "
            f"{html.count('<table')} <table> elements on the page")
        raw = [line for line in visible_text(html).splitlines() if SEPARATOR.match(line.strip())]
        assert not raw, f"{page}: a table is shown as raw text: {raw[0]!r}"
    assert expected_total >= MIN_TABLE_OUTPUTS, (
        f"only {expected_total} displayed Markdown tables found in the executed notebooks")
