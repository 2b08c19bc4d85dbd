"""binder/ (what mybinder.org builds for the chapters' launch buttons) stays in step with the
environment `make venv` builds: the same lock, torch's CPU build of the locked version, the
package from the checkout, and JupyterLab opening MyST sources as notebooks (lab/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"


def _lock_pin(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)$", (REPO / "requirements.lock").read_text(),
                      re.M)
    assert match, f"{name} is not pinned in requirements.lock"
    return match.group(1)


def _requirements() -> list[str]:
    return [line.strip() for line in (BINDER / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_binder_installs_the_lock_and_the_cpu_build_of_its_torch():
    lines = _requirements()
    assert "-r ../requirements.lock" in lines
    assert f"torch=={_lock_pin('torch')}+cpu" in lines
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    for pin in ("jupyterlab", "jupyterlab_myst", "jupytext"):
        _lock_pin(pin)  # the lab that opens the chapters comes with the lock


def test_binder_python_is_the_one_the_project_supports():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime == "python-3.11"
    assert 'requires-python = ">=3.11"' in (REPO / "pyproject.toml").read_text()


def test_post_build_installs_the_package_and_start_points_lab_at_the_settings():
    post = (BINDER / "postBuild").read_text()
    assert "pip install --no-deps --no-build-isolation -e ." in post
    start = (BINDER / "start").read_text()
    assert 'JUPYTER_CONFIG_PATH="$HOME/lab' in start and start.rstrip().endswith('exec "$@"')
    assert (REPO / "lab" / "labconfig" / "default_setting_overrides.json").is_file()
    for script in ("postBuild", "start"):
        assert (BINDER / script).stat().st_mode & 0o111, f"binder/{script} is not executable"
        assert subprocess.run(["bash", "-n", str(BINDER / script)]).returncode == 0
