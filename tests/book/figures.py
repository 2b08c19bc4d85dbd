"""What a reader should find of each chapter's figures, page by page.

Three counts must agree for every page: the figure cells of the chapter source
(code cells with ``mystnb.figure`` metadata), the figures the executed notebook
shows (:func:`grpo_companion.book.pipeline.visible_figures`) and the numbered
``<figure>`` elements of the built HTML. Each HTML figure must hold an image
that loads, is not blank and is drawn at twice its display size (sharp on
high-DPI screens), a "Fig. N.M" caption, alt text, and must be cited from the
prose of some page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import jupytext
import nbformat

from grpo_companion.book.pipeline import visible_figures


@dataclass
class HtmlFigure:
    id: str = ""
    images: list[dict[str, str]] = field(default_factory=list)
    caption: str = ""


class _Figures(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.figures: list[HtmlFigure] = []
        self.loose_images: list[dict[str, str]] = []  # chapter images outside a <figure>
        self.links: list[str] = []
        self._depth = 0
        self._in_caption = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self._depth += 1
            if self._depth == 1:
                self.figures.append(HtmlFigure(id=a.get("id", "")))
        elif tag == "img" and "_static" not in a.get("src", ""):
            (self.figures[-1].images if self._depth else self.loose_images).append(a)
        elif tag == "figcaption" and self._depth:
            self._in_caption = True
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure" and self._depth:
            self._depth -= 1
        elif tag == "figcaption":
            self._in_caption = False

    def handle_data(self, data: str) -> None:
        if self._in_caption and self.figures:
            self.figures[-1].caption += data


def parse_page(page: Path) -> _Figures:
    parser = _Figures()
    parser.feed(page.read_text())
    return parser


def source_figure_cells(source: Path) -> int:
    """Code cells of a chapter source that declare a figure (``mystnb.figure``)."""
    nb = jupytext.read(source)
    return sum(1 for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("mystnb", {}).get("figure"))


def _display_width(img: dict[str, str]) -> float | None:
    m = re.search(r"width:\s*([\d.]+)px", img.get("style", "")) or \
        re.match(r"([\d.]+)", img.get("width", ""))
    return float(m.group(1)) if m else None


def image_problems(path: Path, display_width: float | None) -> list[str]:
    """Why an image file would look broken, blank or blurred (empty if fine)."""
    from PIL import Image, ImageStat

    if not path.exists():
        return [f"image file missing: {path.name}"]
    if path.suffix == ".svg":
        text = path.read_text()
        return [] if text.count("<path") >= 5 else [f"{path.name}: SVG with almost no drawing"]
    with Image.open(path) as im:
        width, height = im.size
        gray = im.convert("L")
        spread = ImageStat.Stat(gray).stddev[0]
        colours = len(im.convert("RGB").getcolors(maxcolors=1 << 16) or range(1 << 16))
    problems = []
    if width < 200 or height < 100:
        problems.append(f"{path.name}: only {width}x{height} px")
    if spread < 5 or colours < 8:
        problems.append(f"{path.name}: blank (grey-level spread {spread:.1f}, {colours} colours)")
    if display_width and width < 1.9 * display_width:
        problems.append(f"{path.name}: {width} px drawn for {display_width:.0f} px shown "
                        "(not sharp on a high-DPI screen)")
    return problems


@dataclass
class PageFigures:
    """The three counts of one page and what is wrong with its figures."""

    page: str
    in_source: int
    in_notebook: int
    in_html: int
    ids: list[str]
    problems: list[str]


def check_page(html_dir: Path, doc: str, root: Path) -> PageFigures:
    """Figures of toc document ``doc``: source (under ``root``), executed notebook
    (the staged tree beside ``html_dir``) and built page."""
    page = html_dir / f"{doc}.html"
    staged = html_dir.parent / "stage" / f"{doc}.ipynb"
    source = root / f"{doc}.md"
    in_source = source_figure_cells(source) if staged.exists() and source.exists() else 0
    in_notebook = len(visible_figures(nbformat.read(staged, as_version=4))) \
        if staged.exists() else 0
    parsed = parse_page(page)
    problems = [f"image outside a numbered figure: {img.get('src')}"
                for img in parsed.loose_images]
    for fig in parsed.figures:
        label = fig.id or "<figure without id>"
        if len(fig.images) != 1:
            problems.append(f"{label}: {len(fig.images)} images in one figure")
        if not re.search(r"Fig\. \d+(\.\d+)*", fig.caption):
            problems.append(f"{label}: no numbered caption")
        for img in fig.images:
            if not img.get("alt", "").strip():
                problems.append(f"{label}: image without alt text")
            target = (page.parent / img["src"].split("#")[0]).resolve()
            problems += [f"{label}: {p}" for p in image_problems(target, _display_width(img))]
    in_html = sum(len(f.images) for f in parsed.figures) + len(parsed.loose_images)
    if not (in_source == in_notebook == in_html):
        problems.append(f"{in_source} figure cells in the source, {in_notebook} figures in "
                        f"the executed notebook, {in_html} images on the page")
    return PageFigures(f"{doc}.html", in_source, in_notebook, in_html,
                       [f.id for f in parsed.figures], problems)


def links_in_book(html_dir: Path, pages: list[str]) -> set[str]:
    """Every ``#fragment`` that some page links to."""
    out = set()
    for page in pages:
        for href in parse_page(html_dir / page).links:
            if "#" in href:
                out.add(href.rsplit("#", 1)[1])
    return out
