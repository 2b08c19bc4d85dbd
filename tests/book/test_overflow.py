"""Nothing clipped: every page of the built book, at 1400 px and at 400 px wide, shows its
math, code, printed outputs and tables whole (issue 25, item 1).

At 400 px a table may scroll inside its own box, but only with a visible "scroll" hint next to
it. The last test shows that the check reports each kind of cut content on a page made to be
cut, so that a passing run means the book's pages fit, not that nothing was measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .browser import chromium, serve
from .overflow import PageLayout, measure_page

pytestmark = pytest.mark.book

DESKTOP, PHONE = 1400, 400


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


@pytest.fixture(scope="module")
def layouts(driver, html_dir: Path, toc_pages: list[str]) -> dict[int, list[PageLayout]]:
    """Every page of the book measured at both widths."""
    with serve(html_dir) as base:
        return {width: [measure_page(driver, base, page, width) for page in toc_pages]
                for width in (DESKTOP, PHONE)}


def _report(offenders) -> str:
    return f"{len(offenders)} cut elements:\n" + "\n".join(str(o) for o in offenders)


def test_viewport_has_the_asked_width(layouts) -> None:
    for width, pages in layouts.items():
        assert {p.viewport for p in pages} == {width}


def test_pages_show_math_code_and_tables(layouts, toc_pages: list[str]) -> None:
    """The check measured what the reader reads: math on most pages, code, tables."""
    for pages in layouts.values():
        assert len(pages) == len(toc_pages)
        totals = {kind: sum(p.counts.get(kind, 0) for p in pages) for kind in ("math", "pre",
                                                                                "table")}
        with_math = sum(1 for p in pages if p.counts.get("math", 0) > 0)
        assert with_math >= len(pages) // 2, f"math on only {with_math} of {len(pages)} pages"
        assert totals["pre"] > 0 and totals["table"] > 0, totals


def test_nothing_is_cut_at_desktop_width(layouts) -> None:
    offenders = [o for page in layouts[DESKTOP] for o in page.offenders]
    assert not offenders, _report(offenders)


def test_nothing_is_cut_on_a_phone(layouts) -> None:
    """At 400 px only a table that says it scrolls may be wider than its box."""
    offenders = [o for page in layouts[PHONE] for o in page.offenders
                 if not (o.hinted and o.tag.startswith("table"))]
    assert not offenders, _report(offenders)


_CUT_PAGE = """<!doctype html><html><head><style>
  article {{ width: 300px; }}
  mjx-container {{ display: block; overflow: auto; }}
  .pst-scrollable-table-container {{ overflow-x: auto; }}
  td {{ white-space: nowrap; }}
</style></head><body><article class="bd-article">
  <section id="cut"><pre>{long_code}</pre>
  <div class="math"><mjx-container display="true"><mjx-math style="display:inline-block;
    width: 600px">wide equation</mjx-math></mjx-container></div>
  <p class="hint">scroll &rarr;</p>
  <div class="pst-scrollable-table-container"><table><tr><td>{wide_cell}</td></tr></table></div>
  <pre>short</pre>
  <div class="pst-scrollable-table-container"><table><tr><td>{wide_cell}</td></tr></table></div>
  </section>
</article></body></html>"""


def test_check_reports_cut_code_math_and_tables(driver, tmp_path: Path) -> None:
    """The check itself, on a page with a cut code line, equation and two wide tables."""
    (tmp_path / "cut.html").write_text(_CUT_PAGE.format(long_code="x = 1  # " + "y" * 200,
                                                        wide_cell="w" * 120))
    with serve(tmp_path) as base:
        layout = measure_page(driver, base, "cut.html", PHONE)
    tags = sorted(o.tag for o in layout.offenders)
    assert tags == ["mjx-container", "pre", "table", "table"], layout.offenders
    tables = [o for o in layout.offenders if o.tag == "table"]
    assert [t.hinted for t in tables] == [True, False]  # the hint is next to the first box only
    assert all(o.excess > 100 and o.page == "cut.html" and o.section == "cut"
               for o in layout.offenders)
    assert layout.counts == {"pre": 2, "math": 1, "table": 2}
