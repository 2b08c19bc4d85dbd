"""Check for, and if needed install, the LaTeX toolchain of ``make pdf``.

The packages are the Debian ones listed in ``scripts/tex_packages.txt``. When ``xelatex``,
``latexmk``, ``xindy`` or ``pdfinfo`` is missing and ``apt-get`` can run without a prompt (as
root, or with passwordless ``sudo -n``), they are installed with
``apt-get install --no-install-recommends``; otherwise one line says what to install, and
the exit status is 1. When everything is there, the versions are printed.

Usage: ``python scripts/install_tex.py [--install]``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

LIST = Path(__file__).with_name("tex_packages.txt")
#: the programs the PDF build and its test run, each with the argument that prints its version
PROGRAMS = {"xelatex": "--version", "latexmk": "-v", "xindy": "--version", "pdfinfo": "-v"}


def packages(path: Path = LIST) -> list[str]:
    """The package names of ``path`` (one a line, ``#`` starts a comment)."""
    names = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [name for name in names if name]


def missing() -> list[str]:
    """The programs of :data:`PROGRAMS` that are not on the ``PATH``."""
    return [name for name in PROGRAMS if shutil.which(name) is None]


def install_command() -> list[list[str]] | None:
    """The ``apt-get`` commands that install the packages without a prompt, or None."""
    apt = shutil.which("apt-get")
    if apt is None:
        return None
    prefix: list[str] = []
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        sudo = shutil.which("sudo")
        if sudo is None or subprocess.run([sudo, "-n", "true"], capture_output=True).returncode:
            return None
        prefix = [sudo, "-n"]
    quiet = [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", apt]
    return [[*quiet, "update", "-qq"],
            [*quiet, "install", "-y", "-qq", "--no-install-recommends", *packages()]]


def versions() -> list[str]:
    """The first line of each program's version, and each package's Debian version."""
    lines = []
    for name, flag in PROGRAMS.items():
        out = subprocess.run([name, flag], capture_output=True, text=True)
        first = next((s for s in (out.stdout + out.stderr).splitlines() if s.strip()), "?")
        lines.append(f"{name}: {first.strip()}")
    if shutil.which("dpkg-query"):
        query = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n",
                                *packages()], capture_output=True, text=True)
        lines += [f"package {line}" for line in query.stdout.splitlines()]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if missing() and "--install" in argv:
        commands = install_command()
        if commands is not None:
            print(f"== installing the LaTeX toolchain: {' '.join(packages())}", flush=True)
            for command in commands:
                subprocess.run(command, check=False)
    if missing():
        print(f"make pdf: {', '.join(missing())} not found. Install on Debian or Ubuntu: "
              f"sudo apt-get install --no-install-recommends {' '.join(packages())}",
              file=sys.stderr)
        return 1
    print("\n".join(versions()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
