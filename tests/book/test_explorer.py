"""The interactive explorer page in headless Chromium: it draws, its controls change the plot,
and nothing is fetched from another host (Plotly's JavaScript comes from the book's _static)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from grpo_companion.book.explorer import DIV_ID, PLOTLY_JS

from .browser import _is_local, _requested_urls, chromium, serve

pytestmark = pytest.mark.book

PAGE = "chapters/explorer.html"
CDN_PLOTLY = "https://cdn.plot.ly/plotly-3.0.1.min.js"

#: Resolves with what the page shows once the explorer is ready (or null after 20 s).
_READY = f"""
const done = arguments[arguments.length - 1], start = Date.now();
(function poll() {{
  const gd = document.getElementById('{DIV_ID}');
  if (gd && gd.dataset.explorerReady === 'true') {{
    done({{traces: gd.data.length, frames: gd._transitionData._frames.length,
           drawn: gd.querySelectorAll('.scatterlayer .trace').length,
           lines: gd.querySelectorAll('.scatterlayer path.js-line').length,
           points: gd.querySelectorAll('.scatterlayer path.point').length,
           sliders: gd.querySelectorAll('.slider-rail-rect').length,
           menus: gd.querySelectorAll('.updatemenu-header').length}});
  }} else if (Date.now() - start > 20000) {{
    done(null);
  }} else {{
    setTimeout(poll, 100);
  }}
}})();
"""

#: The state shown: the controls' indices, the map's data and its drawn SVG path, and the
#: data of the frame that those indices name (stored as Plotly's base64 float32 spec).
_STATE = f"""
function values(v) {{
  if (!v || !v.bdata) return Array.from(v || []);
  const bytes = Uint8Array.from(atob(v.bdata), ch => ch.charCodeAt(0));
  return Array.from(new Float32Array(bytes.buffer));
}}
const gd = document.getElementById('{DIV_ID}');
const c = gd.layout.updatemenus[0].active;
const b = gd.layout.sliders[0].active, r = gd.layout.sliders[1].active;
const frame = gd._transitionData._frameHash[c + '-' + b + '-' + r];
return {{active: [c, b, r], map: Array.from(gd._fullData[2].y),
         cobweb: Array.from(gd._fullData[3].x),
         frame_map: values(frame.data[1].y),
         drawn: gd.querySelectorAll('.scatterlayer .trace')[2]
                  .querySelector('path.js-line').getAttribute('d')}};
"""


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        d.set_window_size(1400, 1000)
        yield d


@pytest.fixture(scope="module")
def page(html_dir: Path, toc_pages: list[str]) -> str:
    if PAGE not in toc_pages:
        pytest.skip(f"{PAGE} is not part of this (partial) build")
    assert (html_dir / PAGE).exists(), f"{PAGE} is in the toc but was not built"
    return PAGE


def _open(driver, base: str, page: str) -> dict | None:
    driver.get_log("performance")  # drop events of earlier pages
    driver.get(f"{base}/{page}")
    return driver.execute_async_script(_READY)


def _click_start_of(driver, selector: str, index: int) -> None:
    """Click a few pixels from the left end of the index-th element matching selector."""
    from selenium.webdriver import ActionChains

    element = driver.find_elements("css selector", f"#{DIV_ID} {selector}")[index]
    width = element.rect["width"]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    ActionChains(driver).move_to_element_with_offset(element, -width / 2 + 4, 0).click().perform()
    time.sleep(0.5)


def _move_slider_to_first_step(driver, slider: int) -> tuple[dict, dict]:
    before = driver.execute_script(_STATE)
    _click_start_of(driver, ".slider-rail-rect", slider)
    return before, driver.execute_script(_STATE)


def test_explorer_draws_and_its_controls_change_the_plot(driver, html_dir: Path,
                                                         page: str) -> None:
    with serve(html_dir) as base:
        seen = _open(driver, base, page)
        assert seen is not None, "the explorer never became ready"
        # six traces (diagonal, p_ref line, map, cobweb, stable and unstable fixed points),
        # drawn as SVG: four lines and at least one fixed-point marker
        assert seen["traces"] == seen["drawn"] == 6, seen
        assert seen["lines"] >= 4 and seen["points"] >= 1, seen
        assert seen["sliders"] == 2 and seen["menus"] == 1, seen
        assert seen["frames"] >= 2 * 2 * 2, seen

        for slider in (1, 0):  # p_ref, then beta (each move redraws the map visibly)
            before, after = _move_slider_to_first_step(driver, slider)
            assert before["active"][1 + slider] != 0, "start on another step than the first"
            assert after["active"][1 + slider] == 0, (before["active"], after["active"])
            assert after["map"] != before["map"], f"slider {slider} did not change the map"
            assert after["drawn"] != before["drawn"], f"slider {slider}: SVG path unchanged"
            assert after["map"] == after["frame_map"], "the plot is not the selected frame"

        # the calibration menu: Dr. GRPO (Omega = 1) makes the map flat
        before = driver.execute_script(_STATE)
        _click_start_of(driver, ".updatemenu-header", 0)
        labels = [e.text for e in driver.find_elements(
            "css selector", f"#{DIV_ID} .updatemenu-dropdown-button")]
        target = next(i for i, text in enumerate(labels) if text.startswith("mean_only"))
        _click_start_of(driver, ".updatemenu-dropdown-button", target)
        after = driver.execute_script(_STATE)
        assert after["active"][0] == target != before["active"][0]
        assert after["map"] == after["frame_map"] != before["map"]
        assert max(after["map"]) - min(after["map"]) < 1e-6, "Dr. GRPO's map is not flat"


def test_explorer_page_fetches_nothing_from_another_host(driver, html_dir: Path,
                                                        page: str) -> None:
    with serve(html_dir) as base:
        assert _open(driver, base, page) is not None, "the explorer never became ready"
        requests = _requested_urls(driver)
    external = [u for u in requests if not _is_local(u, base)]
    assert not external, external
    assert f"{base}/{PLOTLY_JS}" in requests, "Plotly was not loaded from the book's _static"
    assert (html_dir / PLOTLY_JS).stat().st_size > 1_000_000  # the whole bundle, not a stub
    # the embedded data stay small: the whole page, theme included, under 2 MB
    assert (html_dir / page).stat().st_size < 2_000_000


def test_check_fails_when_plotly_comes_from_a_cdn(driver, html_dir: Path, page: str,
                                                  tmp_path: Path) -> None:
    """The check itself: the page's Plotly script pointed at a CDN is seen leaving the
    machine, and the explorer does not start (there is no network here)."""
    site = tmp_path / "site"
    shutil.copytree(html_dir, site, ignore=shutil.ignore_patterns("plotly"))
    html, n = re.subn(r'src="[^"]*plotly/plotly\.min\.js"', f'src="{CDN_PLOTLY}"',
                      (site / page).read_text())
    assert n == 1, "could not find the Plotly script tag to redirect"
    (site / page).write_text(html)
    with serve(site) as base:
        ready = _open(driver, base, page)
        requests = _requested_urls(driver)
    assert CDN_PLOTLY in [u for u in requests if not _is_local(u, base)], requests
    assert ready is None


def test_check_fails_when_slider_steps_change_nothing(driver, html_dir: Path, page: str,
                                                      tmp_path: Path) -> None:
    """The check itself: without the script that follows the sliders, a slider still moves
    but the plot stays as it was, which the main test would report."""
    site = tmp_path / "site"
    shutil.copytree(html_dir, site)
    html, n = re.subn(r"gd\.on\('plotly_sliderchange', showSelected\);", "",
                      (site / page).read_text())
    assert n == 1, "could not find the slider handler"
    (site / page).write_text(html)
    with serve(site) as base:
        assert _open(driver, base, page) is not None
        before, after = _move_slider_to_first_step(driver, 0)
    assert after["active"][1] == 0 != before["active"][1]
    assert after["map"] == before["map"] and after["drawn"] == before["drawn"]
    assert after["map"] != after["frame_map"]
