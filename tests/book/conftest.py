"""Fixtures for checks of the built book (marker ``book``).

``make test`` builds the quick book into ``_build/quick`` and runs these tests
with ``GRPO_BOOK_HTML`` pointing at its HTML; a missing book is then an error.
Run alone, without the variable, they look at ``_build/quick/html`` and are
skipped when it does not exist.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_companion.book.pipeline import REPO_ROOT, toc_documents


@pytest.fixture(scope="session")
def html_dir() -> Path:
    configured = os.environ.get("GRPO_BOOK_HTML")
    path = Path(configured) if configured else REPO_ROOT / "_build" / "quick" / "html"
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not (path / "index.html").exists():
        if configured:
            pytest.fail(f"GRPO_BOOK_HTML={configured} holds no built book (index.html missing)")
        pytest.skip("no built book; run `python -m grpo_companion book --quick --out _build/quick`")
    return path


@pytest.fixture(scope="session")
def toc_pages(html_dir: Path) -> list[str]:
    """Every document of the built book's ``_toc.yml`` (in the staged tree beside the HTML)."""
    return [f"{doc}.html" for doc in toc_documents(html_dir.parent / "stage")]
