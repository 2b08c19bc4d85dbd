"""Find a Chromium-family browser and a matching driver for the browser test.

Standard library only, so that it runs before anything is installed. Used in two
places: ``make browser-deps`` (the command line below, with ``--install``) and
``tests/book/browser.py`` (``find_browser()``, which never installs).

Search order, stopping at the first browser that has a usable driver:

1. ``GRPO_BROWSER`` / ``GRPO_CHROMEDRIVER``, when set: a path or a name on the PATH;
2. the browsers on the PATH (Chromium, Google Chrome, Microsoft Edge under their usual
   command names), then the usual install places of the operating system (macOS app
   bundles, ``/opt/google/chrome``, ...);
3. for each browser, a driver of the same major version: ``GRPO_CHROMEDRIVER``, then on
   the PATH, then beside the browser, then the one Selenium Manager (shipped inside the
   ``selenium`` wheel) provides, which needs the network unless it has one cached;
4. with ``install=True`` only: the system package manager, when it can run without a
   prompt (root, or ``sudo -n``): ``apt-get`` (Debian's ``chromium`` and
   ``chromium-driver``) or ``dnf`` (``chromium`` and ``chromedriver``); then search again.

When nothing works, :class:`BrowserNotFound` carries one line naming what to install on
this operating system, plus the details of what was tried.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

BROWSER_NAMES = (
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
    "chrome",
    "microsoft-edge",
    "microsoft-edge-stable",
    "msedge",
)

LINUX_PLACES = (
    "/usr/lib/chromium/chromium",
    "/usr/lib/chromium-browser/chromium-browser",
    "/usr/lib64/chromium-browser/chromium-browser",
    "/opt/google/chrome/chrome",
    "/opt/chromium.org/chromium/chromium",
    "/opt/microsoft/msedge/msedge",
    "/snap/bin/chromium",
)

MAC_BUNDLES = (
    "Google Chrome.app/Contents/MacOS/Google Chrome",
    "Chromium.app/Contents/MacOS/Chromium",
    "Google Chrome for Testing.app/Contents/MacOS/Google Chrome for Testing",
    "Microsoft Edge.app/Contents/MacOS/Microsoft Edge",
)

# Drivers outside the PATH: Debian keeps one beside its chromium, snap and Homebrew
# put theirs in their own bin folders.
LINUX_DRIVER_PLACES = (
    "/usr/lib/chromium/chromedriver",
    "/usr/lib/chromium-browser/chromedriver",
    "/snap/bin/chromium.chromedriver",
)
MAC_DRIVER_PLACES = ("/opt/homebrew/bin/chromedriver", "/usr/local/bin/chromedriver")

PACKAGES = {
    "apt-get": ("chromium", "chromium-driver"),
    "dnf": ("chromium", "chromedriver"),
}

TIMEOUT_S = 60


class Browser(NamedTuple):
    """A browser binary and the driver to control it."""

    binary: str
    driver: str
    kind: str  # "chrome" (Chrome, Chromium) or "edge"
    version: str  # the browser's major version, "" when it could not be read
    source: str  # where the driver came from


class BrowserNotFound(RuntimeError):
    """No usable browser and driver; ``str()`` is the one-line advice."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _which(name: str, path: str) -> str | None:
    return shutil.which(name, path=path) if path else None


def _executable(candidate: str) -> bool:
    return os.path.isfile(candidate) and os.access(candidate, os.X_OK)


def _kind(binary: str) -> str:
    return "edge" if "edge" in Path(binary).name.lower() else "chrome"


def _run(argv: Sequence[str], env: Mapping[str, str], timeout: float = TIMEOUT_S):
    return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True,
                          timeout=timeout, check=False)


def major_version(executable: str, env: Mapping[str, str]) -> str:
    """The major version ``EXECUTABLE --version`` reports (``"156"``), or ``""``."""
    try:
        out = _run([executable, "--version"], env, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    match = re.search(r"\b(\d+)\.\d+\.\d+(?:\.\d+)?\b", out)
    return match.group(1) if match else ""


def standard_places(system: str, env: Mapping[str, str]) -> list[str]:
    """Where browsers are installed outside the PATH on this operating system."""
    if system == "Darwin":
        roots = ["/Applications"]
        if env.get("HOME"):
            roots.append(os.path.join(env["HOME"], "Applications"))
        return [os.path.join(root, bundle) for root in roots for bundle in MAC_BUNDLES]
    return list(LINUX_PLACES)


def standard_driver_places(system: str) -> list[str]:
    """Where chromedriver is installed outside the PATH on this operating system."""
    return list(MAC_DRIVER_PLACES if system == "Darwin" else LINUX_DRIVER_PLACES)


def default_selenium_manager() -> str | None:
    """The Selenium Manager binary: ``SE_MANAGER_PATH`` or the one in the selenium wheel."""
    if os.environ.get("SE_MANAGER_PATH"):
        return os.environ["SE_MANAGER_PATH"]
    import importlib.util

    try:
        spec = importlib.util.find_spec("selenium")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    common = Path(next(iter(spec.submodule_search_locations))) / "webdriver" / "common"
    machine = platform.machine().lower()
    if sys.platform == "darwin":
        sub = "macos"
    elif machine in ("aarch64", "arm64"):
        sub = "linux-arm64"
    else:
        sub = "linux-x86_64"
    found = common / sub / "selenium-manager"
    return str(found) if found.is_file() else None


class _Search:
    """One discovery run; ``tried`` collects what was looked at, for the error message."""

    def __init__(self, env: Mapping[str, str], places: Sequence[str],
                 driver_places: Sequence[str], selenium_manager: str | None) -> None:
        self.env = env
        self.path = env.get("PATH", "")
        self.places = places
        self.driver_places = driver_places
        self.selenium_manager = selenium_manager
        self.tried: list[str] = []
        self.browsers_seen: list[tuple[str, str]] = []

    def _resolve(self, variable: str) -> str | None:
        value = self.env.get(variable, "")
        if not value:
            return None
        found = value if os.sep in value else _which(value, self.path)
        if not found or not _executable(found):
            raise BrowserNotFound(f"{variable}={value} is not an executable file; fix or unset it")
        return found

    def browsers(self) -> list[str]:
        chosen = self._resolve("GRPO_BROWSER")
        if chosen:
            return [chosen]
        out: list[str] = []
        seen: set[str] = set()
        on_path = [_which(name, self.path) for name in BROWSER_NAMES]
        for candidate in [*on_path, *self.places]:
            if not candidate or not _executable(candidate):
                continue
            key = os.path.realpath(candidate)
            if key not in seen:
                seen.add(key)
                out.append(candidate)
        if not out:
            self.tried.append(f"no browser among {', '.join(BROWSER_NAMES)} on PATH={self.path}"
                              f" nor in {', '.join(self.places) or 'no other place'}")
        return out

    def _driver_candidates(self, binary: str, kind: str) -> Iterable[tuple[str, str]]:
        names = ("msedgedriver",) if kind == "edge" else ("chromedriver", "chromium.chromedriver")
        for name in names:
            found = _which(name, self.path)
            if found:
                yield found, "PATH"
        for folder in dict.fromkeys(os.path.dirname(p) for p in (binary, os.path.realpath(binary))):
            for name in names:
                yield os.path.join(folder, name), "beside the browser"
        if kind == "chrome":
            for place in self.driver_places:
                yield place, place

    def _from_selenium_manager(self, binary: str, kind: str) -> str | None:
        manager = self.selenium_manager
        if not manager or not _executable(manager):
            self.tried.append("Selenium Manager not available (it comes with the selenium wheel)")
            return None
        argv = [manager, "--browser", "edge" if kind == "edge" else "chrome",
                "--browser-path", binary, "--skip-driver-in-path", "--avoid-browser-download",
                "--avoid-stats", "--output", "json", "--timeout", "30"]
        try:
            proc = _run(argv, self.env, timeout=120)
            result = json.loads(proc.stdout or "{}").get("result", {})
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self.tried.append(f"Selenium Manager failed: {exc}")
            return None
        driver = result.get("driver_path") or ""
        if proc.returncode == 0 and driver and _executable(driver):
            return driver
        reason = result.get("message") or f"exit status {proc.returncode}"
        self.tried.append(f"Selenium Manager found no driver (offline?): {reason}")
        return None

    def driver_for(self, binary: str) -> Browser | None:
        kind = _kind(binary)
        version = major_version(binary, self.env)
        self.browsers_seen.append((binary, version))
        forced = self._resolve("GRPO_CHROMEDRIVER")
        if forced:
            return Browser(binary, forced, kind, version, "GRPO_CHROMEDRIVER")
        seen: set[str] = set()
        for candidate, source in self._driver_candidates(binary, kind):
            key = os.path.realpath(candidate)
            if key in seen or not _executable(candidate):
                continue
            seen.add(key)
            driver_version = major_version(candidate, self.env)
            if version and driver_version and driver_version != version:
                self.tried.append(f"{candidate} is version {driver_version}, "
                                  f"{binary} is version {version}")
                continue
            return Browser(binary, candidate, kind, version, source)
        driver = self._from_selenium_manager(binary, kind)
        if driver:
            return Browser(binary, driver, kind, version, "Selenium Manager")
        self.tried.append(f"no matching driver for {binary} (version {version or '?'})")
        return None

    def run(self) -> Browser | None:
        for binary in self.browsers():
            found = self.driver_for(binary)
            if found:
                return found
        return None


def install_command(env: Mapping[str, str], system: str) -> list[list[str]] | None:
    """The package-manager commands that can install a browser without a prompt, or None."""
    path = env.get("PATH", "")
    if system != "Linux":
        return None
    managers = [(name, _which(name, path)) for name in PACKAGES]
    manager, tool = next(((name, tool) for name, tool in managers if tool), ("", None))
    if not tool:
        return None
    packages = PACKAGES[manager]
    if _is_root():
        prefix: list[str] = []
    else:
        sudo = _which("sudo", path)
        try:
            ok = bool(sudo) and _run([sudo, "-n", "true"], env, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if not ok:
            return None
        prefix = [sudo, "-n"]
    if manager == "apt-get":
        # through env(1), so that the variable also reaches apt-get under sudo
        envtool = "/usr/bin/env" if _executable("/usr/bin/env") else shutil.which("env") or "env"
        quiet = [*prefix, envtool, "DEBIAN_FRONTEND=noninteractive", tool]
        return [[*quiet, "update", "-qq"],
                [*quiet, "install", "-y", "-qq", "--no-install-recommends", *packages]]
    return [[*prefix, tool, "install", "-y", "-q", *packages]]


def advice(system: str, env: Mapping[str, str], seen: Sequence[tuple[str, str]]) -> str:
    """One line: what is missing and what to install on this operating system."""
    path = env.get("PATH", "")
    if system == "Darwin":
        how = ("on macOS: brew install --cask google-chrome, then run online once so that"
               " Selenium Manager fetches chromedriver")
    elif system == "Linux" and _which("apt-get", path):
        how = ("on Debian: sudo apt-get install chromium chromium-driver;"
               " on Ubuntu: sudo snap install chromium")
    elif system == "Linux" and _which("dnf", path):
        how = "on Fedora: sudo dnf install chromium chromedriver"
    elif system == "Linux" and _which("pacman", path):
        how = "on Arch: sudo pacman -S chromium (it includes chromedriver)"
    elif system == "Linux" and _which("zypper", path):
        how = "on openSUSE: sudo zypper install chromium chromedriver"
    else:
        how = (f"on {system or 'this system'}: Chromium or Google Chrome with its chromedriver"
               " (or Chrome alone, online, and Selenium Manager fetches the driver)")
    if seen:
        binary, version = seen[0]
        what = f"{binary} (version {version or '?'}) has no chromedriver of its version"
    else:
        what = "no Chrome, Chromium or Edge found"
    return (f"browser test: {what}. Install {how}; or set GRPO_BROWSER and GRPO_CHROMEDRIVER"
            " to their paths.")


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def find_browser(*, install: bool = False, env: Mapping[str, str] | None = None,
                 system: str | None = None, places: Sequence[str] | None = None,
                 driver_places: Sequence[str] | None = None,
                 selenium_manager: str | None = "default") -> Browser:
    """A browser and a matching driver, or :class:`BrowserNotFound` with advice.

    ``env`` (default ``os.environ``, for ``PATH``, ``HOME`` and the ``GRPO_*`` overrides),
    ``system`` (``platform.system()``), ``places`` and ``driver_places`` (browsers and
    drivers outside the PATH) and ``selenium_manager`` (a path, or None for none) exist so
    that the tests can simulate other machines. ``install`` allows one attempt with the
    system package manager.
    """
    env = dict(os.environ if env is None else env)
    system = system or platform.system()
    places = [str(p) for p in (standard_places(system, env) if places is None else places)]
    if driver_places is None:
        driver_places = standard_driver_places(system)
    driver_places = [str(p) for p in driver_places]
    if selenium_manager == "default":
        selenium_manager = default_selenium_manager()

    def search_once() -> _Search:
        return _Search(env, places, driver_places, selenium_manager)

    search = search_once()
    found = search.run()
    if found:
        return found
    if install:
        commands = install_command(env, system)
        if commands is None:
            search.tried.append("no package manager that can install without a prompt"
                                " (needs root or passwordless sudo, and apt-get or dnf)")
        else:
            print("== installing a browser and its driver: " + " ".join(commands[-1]),
                  file=sys.stderr, flush=True)
            for argv in commands:
                proc = subprocess.run(argv, env=env, check=False, stdout=_stderr_fd())
                if proc.returncode != 0:
                    search.tried.append(f"{' '.join(argv)} failed (exit status {proc.returncode})")
                    break
            else:
                again = search_once()
                found = again.run()
                if found:
                    return found
                search.tried.extend(again.tried)
    raise BrowserNotFound(advice(system, env, search.browsers_seen), search.tried)


def _ci(env: Mapping[str, str]) -> bool:
    return env.get("CI", "").strip().lower() in ("1", "true", "yes")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true",
                        help="install with the system package manager when that needs no prompt")
    args = parser.parse_args(argv)
    try:
        found = find_browser(install=args.install)
    except BrowserNotFound as exc:
        if _ci(os.environ):
            bar = "=" * 78
            lines = [bar, "ERROR: CI=true and the browser test cannot run, so make test fails.",
                     exc.message, "What was tried:", *(f"  - {d}" for d in exc.details), bar,
                     f"::error title=no browser for the browser test::{exc.message}"]
            print("\n".join(lines), file=sys.stderr)
        else:
            print(exc.message, file=sys.stderr)
        return 1
    version = f" {found.version}" if found.version else ""
    print(f"== browser: {found.binary} ({found.kind}{version}); "
          f"driver: {found.driver} ({found.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
