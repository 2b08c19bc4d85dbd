"""Which torch build ``.venv`` gets: ``make book TORCH=auto|cpu|cuda``.

Standard library only. The Makefile calls it twice:

``python scripts/torch_build.py choose auto``
    prints ``cuda`` when an NVIDIA driver is present (``nvidia-smi`` on the PATH or
    ``/proc/driver/nvidia``), else ``cpu``; ``cpu`` and ``cuda`` are printed as given.
``.venv/bin/python scripts/torch_build.py install cpu``
    installs the ``torch`` pinned in ``requirements.lock``, alone (``--no-deps``), before
    the rest of the lock. ``cpu`` on Linux asks for the ``+cpu`` local version from the
    PyTorch CPU index, given as an *extra* index so that a wheel on a local index or in
    pip's cache still serves offline; ``cuda`` asks for the exact public version, which is
    the CUDA build on PyPI; macOS has one build (CPU and Apple's MPS) on PyPI. A torch of
    the other build is replaced, and the NVIDIA libraries a CUDA build pulled in are
    removed when switching to CPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CHOICES = ("auto", "cpu", "cuda")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LOCK = Path(__file__).resolve().parent.parent / "requirements.lock"


NVIDIA_PROC = Path("/proc/driver/nvidia")


def nvidia_driver_present(path: str | None = None, proc: Path = NVIDIA_PROC) -> bool:
    """An NVIDIA driver is loaded (Linux) or its ``nvidia-smi`` is installed (also WSL)."""
    path = os.environ.get("PATH", "") if path is None else path
    return (proc / "version").exists() or shutil.which("nvidia-smi", path=path) is not None


def choose(requested: str, *, system: str | None = None, path: str | None = None,
           proc: Path = NVIDIA_PROC) -> str:
    """``cpu`` or ``cuda`` for ``TORCH=requested``; ``ValueError`` for anything else."""
    requested = requested.strip().lower()
    if requested not in CHOICES:
        raise ValueError(f"TORCH={requested!r}: choose one of {', '.join(CHOICES)}")
    system = system or platform.system()
    if requested == "cuda" and system == "Darwin":
        raise ValueError("TORCH=cuda: PyTorch has no CUDA build for macOS; use TORCH=cpu")
    if requested != "auto":
        return requested
    if system == "Darwin":
        return "cpu"
    return "cuda" if nvidia_driver_present(path, proc) else "cpu"


def pinned_version(lock: Path = LOCK) -> str:
    """The ``torch==X`` version of the lock file."""
    for line in lock.read_text().splitlines():
        match = re.fullmatch(r"\s*torch\s*==\s*([^\s#;]+)\s*(#.*)?", line)
        if match:
            return match.group(1)
    raise SystemExit(f"{lock}: no torch==VERSION line")


def requirement(build: str, version: str, system: str | None = None) -> list[str]:
    """The pip arguments that install ``version`` of ``build``."""
    system = system or platform.system()
    public = version.split("+", 1)[0]
    if system == "Darwin":
        return [f"torch=={public}"]
    if build == "cpu":
        return ["--extra-index-url", CPU_INDEX, f"torch=={public}+cpu"]
    # `===` compares the version text: the CUDA build (plain version on PyPI), never a +cpu
    return [f"torch==={public}"]


def build_of(version_py: str) -> str:
    """``cuda`` or ``cpu`` from the text of an installed ``torch/version.py``."""
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", version_py, re.MULTILINE)
    return "cpu" if match is None or match.group(1).strip() == "None" else "cuda"


def installed() -> tuple[str, str] | None:
    """(version, build) of the torch in this interpreter's environment, without importing it."""
    try:
        version = importlib.metadata.version("torch")
        spec = importlib.util.find_spec("torch")
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    version_py = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    text = version_py.read_text() if version_py.is_file() else ""
    return version, build_of(text)


def _pip(args: Sequence[str]) -> int:
    argv = [sys.executable, "-m", "pip", *args]
    print("   " + " ".join(argv[1:]), flush=True)
    return subprocess.run(argv, check=False).returncode


def _cuda_leftovers() -> list[str]:
    names = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("nvidia-", "cuda-")) or name == "triton":
            names.add(name)
    return sorted(names)


def install(build: str, lock: Path = LOCK) -> int:
    """Install the pinned torch of ``build`` into this environment (see the module docstring)."""
    version = pinned_version(lock)
    public = version.split("+", 1)[0]
    current = installed()
    if current and current[0].split("+", 1)[0] == public and current[1] == build:
        print(f"== torch {current[0]} ({build}) already installed")
        return 0
    print(f"== installing torch {public} ({build} build)"
          + (f", replacing {current[0]} ({current[1]})" if current else ""), flush=True)
    args = ["install", "--quiet", "--no-deps"]
    if current:
        args.append("--force-reinstall")
    status = _pip([*args, *requirement(build, version)])
    if status != 0:
        return status
    if current and current[1] == "cuda" and build == "cpu":
        leftovers = _cuda_leftovers()
        if leftovers:
            print("== removing the CUDA build's libraries: " + " ".join(leftovers), flush=True)
            _pip(["uninstall", "--quiet", "-y", *leftovers])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("choose").add_argument("torch", help="auto, cpu or cuda")
    sub.add_parser("install").add_argument("build", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    if args.command == "choose":
        try:
            print(choose(args.torch))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    return install(args.build)


if __name__ == "__main__":
    sys.exit(main())
