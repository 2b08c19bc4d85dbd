"""`make lab`: JupyterLab opens a chapter as a notebook, with MyST rendered.

The Makefile's ``lab`` target starts JupyterLab with ``lab/`` on ``JUPYTER_CONFIG_PATH``; its
``labconfig/default_setting_overrides.json`` makes jupytext's notebook view the default viewer
of Markdown files. These tests start the same server (no browser) and ask it what a reader's
JupyterLab would do: which viewer opens ``chapters/*.md``, and what notebook jupytext gives for
a chapter. A server started without ``lab/`` on the path opens Markdown in the text editor,
which the viewer test reports (it was run that way once to see it fail).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_companion.book.pipeline import REPO_ROOT

LAB_CONFIG = REPO_ROOT / "lab"
CHAPTER = "chapters/01_calibration.md"
JUPYTER = [sys.executable, "-m", "jupyter"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _start_lab(config_path: Path | None, tmp_path: Path) -> Iterator[tuple[str, str]]:
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "user-config")  # nothing from ~/.jupyter
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "user-settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    if config_path is not None:
        env["JUPYTER_CONFIG_PATH"] = str(config_path)
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(
        [*JUPYTER, "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={REPO_ROOT}",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(f"{base}/api/status", token)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()}")
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple[str, str]]:
    yield from _start_lab(LAB_CONFIG, tmp_path_factory.mktemp("lab"))


def _default_viewers(base: str, token: str) -> dict:
    """The viewers JupyterLab's front end will use: the schema's default (where a
    ``default_setting_overrides.json`` lands) under the user's own settings (none here)."""
    plugin = _get(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
    default = plugin["schema"]["properties"]["defaultViewers"].get("default", {})
    return {**default, **plugin["settings"].get("defaultViewers", {})}


def test_markdown_chapters_open_as_notebooks(lab) -> None:
    viewers = _default_viewers(*lab)
    assert viewers.get("markdown") == "Jupytext Notebook", viewers
    assert viewers.get("myst") == "Jupytext Notebook", viewers


def test_jupytext_serves_a_chapter_as_a_notebook_with_every_cell(lab) -> None:
    base, token = lab
    model = _get(f"{base}/api/contents/{CHAPTER}?type=notebook&content=1", token)
    cells = model["content"]["cells"]
    source = (REPO_ROOT / CHAPTER).read_text()
    code_cells = len(re.findall(r"^```\{code-cell\}", source, flags=re.MULTILINE))
    assert code_cells > 3
    assert sum(c["cell_type"] == "code" for c in cells) == code_cells
    assert any("parameters" in c["metadata"].get("tags", []) for c in cells)
    assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"


def test_the_myst_and_jupytext_extensions_are_enabled_and_compatible() -> None:
    listing = subprocess.run([*JUPYTER, "labextension", "list"], capture_output=True,
                             text=True, check=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    for name in ("jupyterlab-myst", "jupyterlab-jupytext"):
        line = next((ln for ln in text.splitlines() if name in ln and " v" in ln), None)
        assert line is not None, f"{name} is not installed:\n{text}"
        # an extension built for another JupyterLab shows "enabled X" (jupyterlab-myst 2.7 with
        # JupyterLab 4.6 did) and does not load
        assert "enabled" in line and "OK" in line, f"{name} does not load:\n{text}"
    assert "not compatible" not in text, text


def test_without_the_lab_folder_markdown_opens_as_text(tmp_path) -> None:
    """The power of the viewer test: the same server without ``lab/`` keeps the editor."""
    for base, token in _start_lab(None, tmp_path):
        assert _default_viewers(base, token).get("markdown") != "Jupytext Notebook"
