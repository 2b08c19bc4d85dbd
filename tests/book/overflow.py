"""Find what a reader cannot see whole: content wider than its box in the built book.

Used by ``test_overflow.py``. A page is loaded in headless Chromium with a viewport of a given
width; once MathJax has typeset (and the book's own layout script, if any, has fitted the math
and marked scrolling tables), every math, code, cell-output and table element of the article
is measured. An element is an *offender* when its content is wider than its box
(``scrollWidth > clientWidth + 1``) or when its right edge lies past the right edge of its
parent's box or of the article (of the content area beside it for the theme's full-width
blocks, which use the margin on wide screens). For math, the typeset formula is measured, not
the container's scrollWidth, which also counts the invisible assistive MathML. Folded content
(solutions, collapsed cells) is opened first, as a reader who opens it must be able to read it.

Only the innermost offender of a nest is reported (a cut ``pre`` makes its output box too wide
as well; the ``pre`` is what to fix). A table whose own box scrolls is *hinted* when a visible
element next to that box says "scroll": the test accepts such tables on a phone only.
"""

from __future__ import annotations

from dataclasses import dataclass

# Selectors of what the reader must see whole: typeset math, code and printed outputs, tables.
CHECKED = (
    "mjx-container",
    "span.math",
    "div.math",
    "pre",
    "div.cell_output",
    "div.cell_output .output",
    "table",
    ".pst-scrollable-table-container",
)

_MEASURE = """
const selectors = arguments[0];
const done = arguments[arguments.length - 1];
const FULL_WIDTH = '.tag_full-width, .tag_full_width, .full-width, .full_width';
function settle() {
  const mj = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
  const layout = window.grpoBookLayout || Promise.resolve();
  const frames = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  return Promise.all([mj || Promise.resolve(), document.fonts.ready]).then(() => layout)
    .then(frames);
}
function openHidden() {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('button.toggle-button').forEach(b => {
    if (b.getAttribute('aria-expanded') === 'false') { b.click(); }
  });
}
function describe(e) {
  const cls = [...e.classList].slice(0, 3).join('.');
  const text = (e.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 70);
  const section = e.closest('section[id]');
  return {tag: e.tagName.toLowerCase() + (cls ? '.' + cls : ''), text: text,
          section: section ? section.id : ''};
}
function isHint(e) {
  if (!e) { return false; }
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && /scroll/i.test(e.innerText || '');
}
function clippedBy(e, stop) {
  for (let a = e.parentElement; a && a !== stop; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== 'visible') { return a; }
  }
  return null;
}
function scrollBox(e) {
  return e.closest('.pst-scrollable-table-container') || e.parentElement;
}
function measure() {
  const article = document.querySelector('article.bd-article') || document.body;
  const viewportRight = document.documentElement.clientWidth;
  const articleRight = Math.min(article.getBoundingClientRect().right, viewportRight);
  // a full-width block may use the margin beside the article (the theme hides the page's
  // table of contents while one is in view), not more than the content area
  const content = document.querySelector('.bd-content') || article;
  const marginRight = Math.min(content.getBoundingClientRect().right, viewportRight);
  const seen = [...article.querySelectorAll(selectors.join(','))];
  const counts = {};
  const offenders = [];
  for (const e of seen) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) { continue; }
    const key = e.tagName.toLowerCase() === 'mjx-container' ? 'math'
      : e.matches('table') ? 'table' : e.matches('pre') ? 'pre' : null;
    if (key) { counts[key] = (counts[key] || 0) + 1; }
    const parent = e.parentElement;
    const parentBlock = parent && getComputedStyle(parent).display !== 'inline';
    const parentRight = parentBlock ? parent.getBoundingClientRect().right : Infinity;
    // The scrollWidth of math counts its invisible assistive MathML: for math, measure how far
    // the typeset formula (mjx-math) reaches past the box instead.
    const formula = e.matches('mjx-container, .math') ? e.querySelector('mjx-math') : null;
    const boxRight = e.clientWidth > 0 ? r.left + e.clientLeft + e.clientWidth : r.right;
    const inner = formula ? formula.getBoundingClientRect().right - boxRight
      : e.clientWidth > 0 ? e.scrollWidth - e.clientWidth : 0;
    const pastParent = r.right - parentRight;
    // inside a box that clips or scrolls, reaching past the article is that box's overflow
    const limit = e.closest(FULL_WIDTH) ? marginRight : articleRight;
    const pastArticle = clippedBy(e, article) ? 0 : r.right - limit;
    const excess = Math.max(inner, pastParent, pastArticle);
    if (excess > 1) {
      const table = e.matches('table') ? e : e.querySelector(':scope > table');
      const box = table ? scrollBox(table) : null;
      const hinted = !!box && (isHint(box.previousElementSibling) ||
                               isHint(box.nextElementSibling));
      offenders.push(Object.assign(describe(e), {excess: Math.round(excess), hinted: hinted,
                                                 node: e}));
    }
  }
  // keep the innermost offender of each nest
  const innermost = offenders.filter(o => !offenders.some(
    p => p !== o && o.node.contains(p.node)));
  innermost.forEach(o => { delete o.node; });
  return {counts: counts, offenders: innermost, viewport: window.innerWidth};
}
settle().then(() => { openHidden(); return settle(); })
  .then(() => done(measure()), err => done({error: String(err)}));
"""


@dataclass
class Offender:
    """One element whose content a reader cannot see whole."""

    page: str
    width: int
    tag: str
    section: str
    text: str
    excess: int
    hinted: bool

    def __str__(self) -> str:
        hint = ", scroll hint shown" if self.hinted else ""
        return (f"{self.page} @{self.width}px: <{self.tag}> in #{self.section} is {self.excess}px "
                f"too wide{hint}: {self.text!r}")


@dataclass
class PageLayout:
    """What one page showed at one width: checked elements by kind, and the offenders."""

    page: str
    width: int
    viewport: int
    counts: dict[str, int]
    offenders: list[Offender]


def set_width(driver, width: int, height: int = 900) -> None:
    """Give the page a viewport exactly ``width`` CSS pixels wide (not a mobile emulation)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1,
                            "mobile": False})


def measure_page(driver, base: str, page: str, width: int) -> PageLayout:
    """Load ``base/page`` at ``width`` px and measure its math, code, outputs and tables."""
    set_width(driver, width)
    driver.get(f"{base}/{page}")
    seen = driver.execute_async_script(_MEASURE, list(CHECKED))
    if "error" in seen:
        raise RuntimeError(f"{page} @{width}px: the measuring script failed: {seen['error']}")
    offenders = [Offender(page=page, width=width, tag=o["tag"], section=o["section"],
                          text=o["text"], excess=o["excess"], hinted=o["hinted"])
                 for o in seen["offenders"]]
    return PageLayout(page=page, width=width, viewport=seen["viewport"], counts=seen["counts"],
                      offenders=offenders)
