"""pyproject.toml, requirements.lock and environment.yml agree on every direct pin."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from ._load import ROOT

PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)\s*(?:#.*)?$")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines, where: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        match = PIN.match(line)
        if not match:
            raise AssertionError(f"{where}: {line!r} is not an exact pin NAME==VERSION")
        name = _name(match.group(1))
        if name in pins:
            raise AssertionError(f"{where}: {name} is pinned twice")
        pins[name] = match.group(2)
    return pins


def pyproject_pins(path: Path) -> dict[str, str]:
    """Runtime and test dependencies of pyproject.toml, each of which must be ``==``."""
    project = tomllib.loads(path.read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    return _pins(lines, path.name)


def lock_pins(path: Path) -> dict[str, str]:
    lines = [line for line in path.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return _pins(lines, path.name)


def environment_pins(path: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """(pip pins, conda packages, other pip lines such as ``-e .``) of environment.yml."""
    deps = yaml.safe_load(path.read_text())["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = [line for d in deps if isinstance(d, dict) for line in d.get("pip", [])]
    options = [line for line in pip if line.startswith("-")]
    return _pins([p for p in pip if not p.startswith("-")], path.name), conda, options


def disagreements(root: Path) -> list[str]:
    """Every way the three files disagree on a direct pin; empty when they agree."""
    direct = pyproject_pins(root / "pyproject.toml")
    locked = lock_pins(root / "requirements.lock")
    conda_pins, conda, options = environment_pins(root / "environment.yml")
    out = []
    for name, version in direct.items():
        if name not in locked:
            out.append(f"{name}=={version} (pyproject.toml) is missing from requirements.lock")
        elif locked[name] != version:
            out.append(f"{name}: pyproject.toml {version}, requirements.lock {locked[name]}")
        if name not in conda_pins:
            out.append(f"{name}=={version} (pyproject.toml) is missing from environment.yml")
        elif conda_pins[name] != version:
            out.append(f"{name}: pyproject.toml {version}, environment.yml {conda_pins[name]}")
    for name in sorted(set(conda_pins) - set(direct)):
        out.append(f"{name} is pinned in environment.yml but is not a direct dependency")
    if "-e ." not in options:
        out.append("environment.yml does not install the package itself (- -e .)")
    pythons = [c for c in conda if re.fullmatch(r"python\s*[=<>]=?.*", c)]
    lock_header = re.search(r"Python (\d+\.\d+)", (root / "requirements.lock").read_text())
    requires = tomllib.loads((root / "pyproject.toml").read_text())["project"]["requires-python"]
    if not lock_header:
        out.append("requirements.lock does not say which Python it was locked on")
    elif pythons != [f"python={lock_header.group(1)}"]:
        out.append(f"environment.yml asks for {pythons}; the lock is for Python "
                   f"{lock_header.group(1)}")
    elif requires != f">={lock_header.group(1)}":
        out.append(f"requires-python {requires} but the lock is for Python {lock_header.group(1)}")
    return out


def test_the_three_files_agree_on_every_direct_pin() -> None:
    assert disagreements(ROOT) == []


def test_the_lock_pins_what_the_book_needs() -> None:
    locked = lock_pins(ROOT / "requirements.lock")
    assert {"torch", "jupyter-book", "selenium", "trl", "transformers", "accelerate"} <= set(locked)


def _copy(tmp_path: Path) -> Path:
    for name in ("pyproject.toml", "requirements.lock", "environment.yml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    return tmp_path


@pytest.mark.parametrize("file, old, new, expected", [
    ("environment.yml", "- numpy==", "- numpy==0.", "numpy: pyproject.toml"),
    ("environment.yml", "      - selenium==", "      - seleniumbase==", "selenium=="),
    ("environment.yml", "- python=3.11", "- python=3.12", "environment.yml asks for"),
    ("environment.yml", "      - -e .\n", "", "does not install the package"),
    ("requirements.lock", "\ntorch==", "\ntorch==9", "torch: pyproject.toml"),
    ("pyproject.toml", '"sympy==', '"sympy>=', "not an exact pin"),
])
def test_a_changed_pin_is_caught(tmp_path, file, old, new, expected) -> None:
    """The check itself: each kind of drift in a copy of the files is reported."""
    root = _copy(tmp_path)
    text = (root / file).read_text()
    assert old in text, f"{old!r} not in {file}"
    (root / file).write_text(text.replace(old, new, 1))
    try:
        found = disagreements(root)
    except AssertionError as exc:
        found = [str(exc)]
    assert any(expected in problem for problem in found), found
