"""The reading path of every chapter (issue 25, item 3), checked on the sources: an opening
box naming the parameters, a summary, no visible checks, a folded and validated parameters
cell. The rules are in ``tests/book/reading_path.py``; the self-test below shows that each
one fails on a chapter that breaks it."""

from __future__ import annotations

import pytest

from grpo_companion.book.pipeline import REPO_ROOT, toc_documents

from .reading_path import problems

PAGES = toc_documents(REPO_ROOT)
#: the numbered chapters (the explorer is chapter 13) and the errata: the pages a reader
#: works through
CHAPTERS = [doc for doc in PAGES if doc.startswith("chapters/")
            and (doc.split("/")[1][:2].isdigit() or doc in ("chapters/errata",
                                                            "chapters/explorer"))]
OTHER = [doc for doc in PAGES if doc not in CHAPTERS and (REPO_ROOT / f"{doc}.md").exists()
         and "kernelspec" in (REPO_ROOT / f"{doc}.md").read_text()[:400]]


def test_the_pages_are_all_there():
    assert len(CHAPTERS) == 15, CHAPTERS  # 12 numbered, the explorer, beyond the paper, errata
    assert len(OTHER) >= 3, OTHER


@pytest.mark.parametrize("doc", CHAPTERS)
def test_chapter_reading_path(doc):
    assert problems(REPO_ROOT / f"{doc}.md") == []


@pytest.mark.parametrize("doc", OTHER)
def test_other_pages_fold_their_checks_and_parameters(doc):
    assert problems(REPO_ROOT / f"{doc}.md", chapter=False) == []


HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  name: python3
  display_name: Python 3
  language: python
---

# A chapter

Text.
"""
GOOD_BOX = """
```{admonition} In this chapter
:class: chapter-opening

**What you will see.** A map.

**What you need.** Chapter 1. **Parameters:** `quick`, `beta`.
```
"""
PARAMS = """
```{code-cell} ipython3
:tags: [parameters, hide-input]

quick = False
beta = 0.1
```
"""
TEACHING = """
```{code-cell} ipython3
x = beta * 2
```

```{code-cell} ipython3
:tags: [hide-input]

assert x > 0
glue("x", x, display=False)
```
"""
SUMMARY = """
## Summary

- one
- two
- three

## Exercises

Do it.
"""


def _write(tmp_path, text):
    path = tmp_path / "chapter.md"
    path.write_text(text)
    return problems(path)


def test_a_conforming_chapter_passes(tmp_path):
    assert _write(tmp_path, HEADER + GOOD_BOX + PARAMS + TEACHING + SUMMARY) == []


@pytest.mark.parametrize("broken, message", [
    (HEADER + PARAMS + TEACHING + SUMMARY, "no chapter-opening admonition"),
    (HEADER + GOOD_BOX.replace("**What you need.**", "") + PARAMS + TEACHING + SUMMARY,
     "no 'What you need.'"),
    (HEADER + GOOD_BOX.replace("`beta`", "beta") + PARAMS + TEACHING + SUMMARY,
     "does not name parameter `beta`"),
    (HEADER + PARAMS + GOOD_BOX + TEACHING + SUMMARY, "no chapter-opening admonition"),
    (HEADER + GOOD_BOX + PARAMS.replace(", hide-input", "") + TEACHING + SUMMARY,
     "the parameters cell is shown"),
    (HEADER + GOOD_BOX + PARAMS.replace("beta = 0.1", "beta = -0.1") + TEACHING + SUMMARY,
     "beta's default is refused"),
    (HEADER + GOOD_BOX.replace("`beta`", "`beta`, `gamma`")
     + PARAMS.replace("beta = 0.1", "beta = 0.1\ngamma = 1") + TEACHING + SUMMARY,
     "gamma has no rule"),
    (HEADER + GOOD_BOX + PARAMS + TEACHING.replace(":tags: [hide-input]\n", "") + SUMMARY,
     "shows a check or glue call: assert x > 0"),
    (HEADER + GOOD_BOX + PARAMS + TEACHING, "no '## Summary' section"),
    (HEADER + GOOD_BOX + PARAMS + TEACHING + SUMMARY.replace("- three\n", ""),
     "2 bullets"),
    (HEADER + GOOD_BOX + PARAMS + TEACHING + SUMMARY + "\n## More\n\nText.\n",
     "sections after the summary: ['Exercises', 'More']"),
])
def test_each_rule_fails_on_a_chapter_that_breaks_it(tmp_path, broken, message):
    found = _write(tmp_path, broken)
    assert any(message in problem for problem in found), found
