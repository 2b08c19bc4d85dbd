"""Open built pages in headless Chromium and report what a reader would see.

Used by ``test_browser.py``. A page passes when MathJax typeset its math, no raw
TeX delimiters are left in the visible text, every image of the page loaded
(``naturalWidth > 0``), and every request the browser made went to the local
server that serves the book.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-dev-shm-usage",
)

# Visible text of the page without code blocks, after MathJax is done (or has failed).
_WAIT_AND_INSPECT = """
const done = arguments[arguments.length - 1];
function images() {
  return [...document.querySelectorAll('article img')]
    .filter(i => !i.src.includes('/_static/'))
    .map(i => ({src: i.src, natural_width: i.complete ? i.naturalWidth : 0,
                in_figure: !!i.closest('figure')}));
}
function inspect(typesetError) {
  const body = document.body.cloneNode(true);
  body.querySelectorAll('pre, code, script, style, mjx-container, mjx-assistive-mml')
      .forEach(e => e.remove());
  done({
    mathjax_loaded: !!(window.MathJax && window.MathJax.startup),
    typeset_error: typesetError,
    containers: document.querySelectorAll('mjx-container').length,
    math_sources: document.querySelectorAll('.math, div.math, span.math').length,
    text: body.innerText,
    images: images(),
  });
}
const start = Date.now();
const wantsMath = !!document.querySelector('script[src*="tex-chtml"], script[src*="mathjax"]');
const decoded = Promise.all([...document.images].map(i => i.decode().catch(() => null)));
(function poll() {
  if (!wantsMath) {
    decoded.then(() => inspect(null));
  } else if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    Promise.all([window.MathJax.startup.promise, decoded])
      .then(() => inspect(null), e => inspect(String(e)));
  } else if (Date.now() - start > 8000) {
    inspect('MathJax never started');
  } else {
    setTimeout(poll, 100);
  }
})();
"""


@dataclass
class PageReport:
    """What the browser saw on one page."""

    url: str
    mathjax_loaded: bool
    containers: int
    math_sources: int
    raw_tex: list[str]
    typeset_error: str | None
    requests: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)

    @property
    def figures(self) -> int:
        """Images of the page's content that loaded, inside a numbered figure."""
        return sum(1 for i in self.images if i["natural_width"] > 0 and i["in_figure"])

    def problems(self) -> list[str]:
        out = []
        if self.math_sources and not self.mathjax_loaded:
            out.append("MathJax did not load")
        if self.typeset_error:
            out.append(f"MathJax error: {self.typeset_error}")
        if self.math_sources and self.containers == 0:
            out.append(f"{self.math_sources} math elements but nothing typeset")
        if self.raw_tex:
            out.append(f"raw TeX left in the text: {self.raw_tex[:3]}")
        if self.external_requests:
            out.append(f"requests left the machine: {self.external_requests[:5]}")
        broken = [i["src"] for i in self.images if i["natural_width"] <= 0]
        if broken:
            out.append(f"images that did not load: {broken[:3]}")
        return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on an ephemeral loopback port; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def chromium() -> Iterator[object]:
    """A headless Chrome, Chromium or Edge driven by its driver, logging network events."""
    import importlib.util
    import sys

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as ChromeService
    from selenium.webdriver.edge.service import Service as EdgeService

    # The discovery of `make browser-deps` (Chrome, Chromium or Edge and a driver of the same
    # version); it raises with what to install, so that the browser test fails, never skips.
    finder = sys.modules.get("grpo_find_browser")
    if finder is None:
        script = Path(__file__).resolve().parents[2] / "scripts" / "find_browser.py"
        spec = importlib.util.spec_from_file_location("grpo_find_browser", script)
        finder = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = finder
        spec.loader.exec_module(finder)
    found = finder.find_browser()
    edge = found.kind == "edge"
    profile = tempfile.mkdtemp(prefix="grpo-chromium-")
    options = webdriver.EdgeOptions() if edge else webdriver.ChromeOptions()
    options.binary_location = found.binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("ms:loggingPrefs" if edge else "goog:loggingPrefs",
                           {"performance": "ALL"})
    if edge:
        driver = webdriver.Edge(service=EdgeService(found.driver), options=options)
    else:
        driver = webdriver.Chrome(service=ChromeService(found.driver), options=options)
    driver.set_script_timeout(30)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _requested_urls(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def _is_local(url: str, base: str) -> bool:
    """Requests to the book's server or the browser's own schemes (data:, chrome:, ...)."""
    scheme = url.split(":", 1)[0].lower()
    return url.startswith(base) or scheme not in ("http", "https", "ws", "wss", "ftp")


def inspect_page(driver, base: str, page: str) -> PageReport:
    """Load ``base/page``, wait for MathJax and collect what the reader would see."""
    driver.get_log("performance")  # drop events of earlier pages
    url = f"{base}/{page}"
    driver.get(url)
    seen = driver.execute_async_script(_WAIT_AND_INSPECT)
    requests = _requested_urls(driver)
    text = seen["text"]
    raw = [d for d in ("$$", "\\[", "\\(", "\\begin{") if d in text]
    return PageReport(
        url=url,
        mathjax_loaded=seen["mathjax_loaded"],
        containers=seen["containers"],
        math_sources=seen["math_sources"],
        raw_tex=raw,
        typeset_error=seen["typeset_error"],
        requests=requests,
        external_requests=[u for u in requests if not _is_local(u, base)],
        images=seen["images"],
    )
