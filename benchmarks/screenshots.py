"""Headless-Chromium screenshots of every page of a built book, as a reader sees it.

Run: ``make screenshots`` or ``python benchmarks/screenshots.py [--html DIR] [--out DIR]``.
For every page of the book's table of contents, at desktop width (1400 px) and
phone width (400 px), it writes a full-page PNG to ``OUT/<width>/<page>.png``; a page taller
than ``MAX_HEIGHT`` continues in ``<page>-part2.png``, ``-part3.png``... (nothing is cut)
(default ``_build/screenshots``) and records what a look at the page would
notice: images that did not load, and content wider than the window (a table,
a code block or a figure that makes the page scroll sideways). It prints one
JSON object with the timings and these findings, and exits 1 if any page has
a broken image.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from grpo_companion.book.pipeline import toc_documents  # noqa: E402
from tests.book.browser import chromium, serve  # noqa: E402

WIDTHS = (1400, 400)
MAX_HEIGHT = 30000  # px per image; longer pages continue in -partN images

# What a reader would notice: broken images and anything wider than the window.
_LOOK = """
const width = document.documentElement.clientWidth;
const wide = [];
document.querySelectorAll('article *').forEach(e => {
  const r = e.getBoundingClientRect();
  if (r.width > 0 && r.right > width + 1) {
    // content inside its own scrolling box does not push the page sideways
    let box = e.parentElement, scrolls = false;
    while (box && box.tagName !== 'ARTICLE') {
      const o = getComputedStyle(box).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden') { scrolls = true; break; }
      box = box.parentElement;
    }
    const name = e.tagName.toLowerCase();
    if (!scrolls) wide.push(e.className ? name + '.' + String(e.className).split(' ')[0] : name);
  }
});
const imgs = [...document.querySelectorAll('article img')];
return {
  height: Math.min(document.documentElement.scrollHeight, MAX_HEIGHT),
  full_height: document.documentElement.scrollHeight,
  page_width: document.documentElement.scrollWidth,
  window_width: width,
  images: imgs.length,
  broken_images: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  wider_than_window: [...new Set(wide)].slice(0, 8),
};
""".replace("MAX_HEIGHT", str(MAX_HEIGHT))


def _wait_for_page(driver) -> None:
    """Wait until images are decoded and MathJax (if any) has typeset."""
    driver.execute_async_script("""
      const done = arguments[arguments.length - 1];
      const imgs = [...document.images].map(i => i.decode().catch(() => null));
      const math = (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise)
                   || Promise.resolve();
      Promise.all([...imgs, math]).then(() => done(true), () => done(false));
    """)


def screenshot_book(html: Path, out: Path, widths=WIDTHS) -> dict[str, object]:
    pages = [f"{doc}.html" for doc in toc_documents(html.parent / "stage")]
    t0 = time.perf_counter()
    report: dict[str, object] = {"html": str(html), "out": str(out), "pages": len(pages),
                                 "widths": list(widths), "findings": {}}
    findings: dict[str, dict] = report["findings"]  # type: ignore[assignment]
    shots = 0
    with serve(html) as base, chromium() as driver:
        for width in widths:
            for page in pages:
                driver.set_window_size(width, 900)
                driver.get(f"{base}/{page}")
                _wait_for_page(driver)
                seen = driver.execute_script(_LOOK)
                driver.set_window_size(width, int(seen["height"]) + 100)
                _wait_for_page(driver)
                parts = max(1, math.ceil(int(seen["full_height"]) / MAX_HEIGHT))
                for k in range(parts):
                    driver.execute_script(f"window.scrollTo(0, {k * MAX_HEIGHT});")
                    suffix = ".png" if k == 0 else f"-part{k + 1}.png"
                    target = out / str(width) / page.replace(".html", suffix)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    driver.save_screenshot(str(target))
                    shots += 1
                notes = {k: seen[k] for k in ("broken_images", "wider_than_window") if seen[k]}
                if seen["page_width"] > seen["window_width"]:
                    notes["page_scrolls_sideways_px"] = seen["page_width"] - seen["window_width"]
                notes["images"] = seen["images"]
                findings.setdefault(page, {})[str(width)] = notes
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["screenshots"] = shots
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=None,
                        help="built HTML (default: _build/html, else _build/quick/html)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "screenshots")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    args = parser.parse_args(argv)
    html = args.html
    if html is None:
        html = next((d for d in (REPO_ROOT / "_build" / "html", REPO_ROOT / "_build/quick/html")
                     if (d / "index.html").exists()), None)
    if html is None or not (html / "index.html").exists():
        print("error: no built book; run `make book` (or `make book-quick`) first",
              file=sys.stderr)
        return 2
    report = screenshot_book(html.resolve(), args.out.resolve(), tuple(args.widths))
    print(json.dumps(report, indent=1))
    broken = [p for p, by_width in report["findings"].items()
              for notes in by_width.values() if notes.get("broken_images")]
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
