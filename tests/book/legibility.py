"""How large the text of each figure is on the page, as a reader's browser shows it.

Each figure a chapter shows carries, in its executed notebook, the record that
:func:`grpo_companion.plotting.text_record` made when IPython displayed it: the
smallest font drawn (points), the figure's dpi and the image's natural (1x) width.
The browser gives the width the page actually shows the image at, on a screen
:data:`SCREEN_WIDTH` pixels wide; :func:`grpo_companion.plotting.displayed_text_px`
turns the three into CSS pixels. The page's column width is measured, not assumed,
so a change of the theme's layout changes the result.

Run as a script to print the table for a built book::

    .venv/bin/python -m tests.book.legibility _build/quick/html
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import nbformat

from grpo_companion.book.pipeline import Figure, toc_documents, visible_figures
from grpo_companion.plotting import MIN_TEXT_PX, displayed_text_px

#: The desktop screen width (CSS pixels) at which figures must be legible.
SCREEN_WIDTH = 1400

_MEASURE = """
const done = arguments[arguments.length - 1];
const images = [...document.querySelectorAll('article figure img')]
  .filter(i => !i.src.includes('/_static/'));
Promise.all(images.map(i => i.decode().catch(() => null))).then(() => done({
  viewport: window.innerWidth,
  images: images.map(i => ({
    url: i.src,
    figure: i.closest('figure').id,
    shown: i.getBoundingClientRect().width,
    natural: i.naturalWidth,
  })),
}));
"""


@dataclass(frozen=True)
class FigureText:
    """The smallest text of one figure as shown (``px`` is None when it has no text)."""

    page: str
    figure: str
    shown_width: float
    natural_width: float
    min_pt: float | None
    text: str
    px: float | None

    def line(self) -> str:
        size = "no text" if self.px is None else f"{self.px:4.1f} px ({self.min_pt:g} pt)"
        return (f"{self.page} #{self.figure}: {size}, shown {self.shown_width:.0f} of "
                f"{self.natural_width:.0f} px, smallest text {self.text!r}")


@dataclass
class PageText:
    """What was measured on one page, and what could not be."""

    page: str
    viewport: int
    figures: list[FigureText]
    problems: list[str]


def notebook_figures(html_dir: Path, page: str) -> list[Figure]:
    """The visible figures of the executed notebook staged beside the HTML."""
    staged = html_dir.parent / "stage" / page.replace(".html", ".ipynb")
    return visible_figures(nbformat.read(staged, as_version=4)) if staged.exists() else []


def set_screen(driver, width: int = SCREEN_WIDTH, height: int = 1000) -> None:
    """Make the page's viewport exactly ``width`` CSS pixels wide (device pixel ratio 1)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def measure_page(driver, base: str, html_dir: Path, page: str) -> PageText:
    """Load ``base/page`` and compute the smallest text of each figure on it."""
    driver.get(f"{base}/{page}")
    seen = driver.execute_async_script(_MEASURE)
    by_hash = {f.image_sha256: f for f in notebook_figures(html_dir, page)}
    figures, problems = [], []
    for image in seen["images"]:
        label = f"{page} #{image['figure']}"
        path = html_dir / unquote(urlparse(image["url"]).path).lstrip("/")
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        fig = by_hash.get(digest)
        if fig is None:
            problems.append(f"{label}: its image is not an output of the staged notebook")
            continue
        record = fig.text
        if not record:
            problems.append(f"{label}: no text record (was it drawn after use_book_style()?)")
            continue
        if image["shown"] <= 0 or image["natural"] <= 0:
            problems.append(f"{label}: not shown (width {image['shown']}, "
                            f"natural width {image['natural']})")
            continue
        points = record["min_pt"]
        px = None if points is None else displayed_text_px(
            points, record["dpi"], record["width_px"], image["shown"])
        figures.append(FigureText(page, image["figure"], image["shown"], record["width_px"],
                                  points, record.get("text", ""), px))
    return PageText(page, seen["viewport"], figures, problems)


def too_small(figures: list[FigureText], limit: float = MIN_TEXT_PX) -> list[FigureText]:
    """The figures whose smallest text is under ``limit`` CSS pixels."""
    return [f for f in figures if f.px is not None and f.px < limit]


def measure_book(driver, html_dir: Path, pages: list[str]) -> list[PageText]:
    """Every page of ``pages`` at the desktop screen width."""
    from .browser import serve

    set_screen(driver)
    with serve(html_dir) as base:
        return [measure_page(driver, base, html_dir, page) for page in pages]


def main(argv: list[str]) -> int:
    """Print every figure's smallest text on the pages of the book built in ``argv[0]``."""
    from .browser import chromium

    html_dir = Path(argv[0]).resolve()
    pages = [f"{doc}.html" for doc in toc_documents(html_dir.parent / "stage")]
    with chromium() as driver:
        measured = measure_book(driver, html_dir, pages)
    figures = [f for p in measured for f in p.figures]
    for f in figures:
        print(("  SMALL " if f in too_small(figures) else "  ok    ") + f.line())
    for p in measured:
        for problem in p.problems:
            print("  ?     " + problem)
    print(f"{len(too_small(figures))} of {len(figures)} figures have text under "
          f"{MIN_TEXT_PX:g} px at {SCREEN_WIDTH} px")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
