"""Browser discovery (scripts/find_browser.py) on simulated machines.

Each machine is a PATH of temporary folders holding fake executables (shell scripts that
print a version, or log their arguments), an explicit list of the places outside the PATH,
and a fake Selenium Manager, so that the real browser of this machine never interferes.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ._load import script

fb = script("find_browser")

CHROMIUM = "Chromium 156.0.8078.114 built on Debian GNU/Linux 12 (bookworm)"
CHROME = "Google Chrome 156.0.8078.50"
DRIVER = "ChromeDriver 156.0.8078.114 (ea19f9737303a76e07b53c6a1eec43355aca3b1d)"
OLD_DRIVER = "ChromeDriver 120.0.6099.109 (3419140ab665596f21b385ce136419fde0924272)"
LOG_ARGS = 'printf "%s\\n" "$*" >> '  # a fake's log line (dash's echo would eat a "-n")


def fake(path: Path, output: str = "", body: str = "") -> Path:
    """An executable shell script at ``path`` that runs ``body`` and prints ``output``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\necho '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def manager(tmp_path: Path, driver: Path | None) -> str:
    """A fake Selenium Manager: offers ``driver``, or fails as it does offline."""
    if driver is None:
        result = {"code": 65, "message": "error sending request (offline)", "driver_path": ""}
        return str(fake(tmp_path / "sm" / "selenium-manager", json.dumps({"result": result}),
                        body="trap 'exit 65' EXIT"))
    result = {"code": 0, "message": "", "driver_path": str(driver), "browser_path": ""}
    return str(fake(tmp_path / "sm" / "selenium-manager", json.dumps({"result": result})))


def find(tmp_path: Path, path: list[Path], *, system: str = "Linux", places=(),
         driver_places=(), selenium_manager=None, install=False, **env):
    environ = {"PATH": os.pathsep.join(map(str, path)), "HOME": str(tmp_path / "home"), **env}
    return fb.find_browser(install=install, env=environ, system=system, places=list(places),
                           driver_places=list(driver_places), selenium_manager=selenium_manager)


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(fb, "_is_root", lambda: False)


@pytest.fixture
def root(monkeypatch):
    monkeypatch.setattr(fb, "_is_root", lambda: True)


def test_browser_in_a_non_standard_place_without_apt_get(tmp_path, not_root):
    """No apt-get, no sudo, Chrome unpacked under the home folder and put on the PATH."""
    bin_dir = tmp_path / "home" / "opt" / "chrome-linux64"
    fake(bin_dir / "google-chrome", CHROME)
    fake(bin_dir / "chromedriver", DRIVER)
    found = find(tmp_path, [bin_dir], install=True)
    assert found == fb.Browser(str(bin_dir / "google-chrome"), str(bin_dir / "chromedriver"),
                               "chrome", "156", "PATH")


def test_browser_and_driver_in_separate_path_folders(tmp_path):
    fake(tmp_path / "a" / "chromium", CHROMIUM)
    fake(tmp_path / "b" / "chromedriver", DRIVER)
    found = find(tmp_path, [tmp_path / "empty", tmp_path / "a", tmp_path / "b"])
    assert (found.binary, found.driver) == (str(tmp_path / "a" / "chromium"),
                                            str(tmp_path / "b" / "chromedriver"))


def test_browser_outside_the_path_with_its_driver_beside_it(tmp_path):
    chrome = fake(tmp_path / "opt" / "google" / "chrome" / "chrome", CHROME)
    fake(chrome.parent / "chromedriver", DRIVER)
    found = find(tmp_path, [tmp_path / "bin"], places=[tmp_path / "nowhere", chrome])
    assert found.binary == str(chrome) and found.source == "beside the browser"


def test_a_symlinked_browser_finds_the_driver_beside_its_target(tmp_path):
    chrome = fake(tmp_path / "opt" / "chrome-linux64" / "chrome", CHROME)
    driver = fake(chrome.parent / "chromedriver", DRIVER)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "google-chrome").symlink_to(chrome)
    found = find(tmp_path, [tmp_path / "bin"])
    assert found.binary == str(tmp_path / "bin" / "google-chrome") and found.driver == str(driver)


def test_a_driver_of_another_version_is_not_used(tmp_path):
    """Chromium 156 with chromedriver 120 on the PATH: Selenium Manager's driver is used."""
    fake(tmp_path / "bin" / "chromium", CHROMIUM)
    fake(tmp_path / "bin" / "chromedriver", OLD_DRIVER)
    good = fake(tmp_path / "cache" / "chromedriver", DRIVER)
    found = find(tmp_path, [tmp_path / "bin"], selenium_manager=manager(tmp_path, good))
    assert (found.driver, found.source) == (str(good), "Selenium Manager")


def test_offline_with_a_mismatched_driver_says_so(tmp_path, not_root):
    fake(tmp_path / "bin" / "chromium", CHROMIUM)
    fake(tmp_path / "bin" / "chromedriver", OLD_DRIVER)
    with pytest.raises(fb.BrowserNotFound) as caught:
        find(tmp_path, [tmp_path / "bin"], selenium_manager=manager(tmp_path, None), install=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "chromium (version 156) has no chromedriver of its version" in message
    assert any("version 120" in d for d in caught.value.details)
    assert any("Selenium Manager found no driver" in d for d in caught.value.details)


def test_selenium_manager_provides_the_driver_when_online(tmp_path):
    fake(tmp_path / "bin" / "google-chrome-stable", CHROME)
    downloaded = fake(tmp_path / "home" / ".cache" / "selenium" / "chromedriver", DRIVER)
    found = find(tmp_path, [tmp_path / "bin"], selenium_manager=manager(tmp_path, downloaded))
    assert found.driver == str(downloaded) and found.source == "Selenium Manager"


def test_edge_with_its_own_driver(tmp_path):
    fake(tmp_path / "bin" / "microsoft-edge", "Microsoft Edge 156.0.3405.80")
    fake(tmp_path / "bin" / "chromedriver", DRIVER)  # not a driver for Edge
    fake(tmp_path / "bin" / "msedgedriver", "Microsoft Edge WebDriver 156.0.3405.80 (abc)")
    found = find(tmp_path, [tmp_path / "bin"])
    assert (found.kind, Path(found.driver).name) == ("edge", "msedgedriver")


def test_overrides_name_the_browser_and_driver(tmp_path):
    fake(tmp_path / "bin" / "chromium", CHROMIUM)
    custom = fake(tmp_path / "custom" / "my-chrome", CHROME)
    driver = fake(tmp_path / "custom" / "my-driver", OLD_DRIVER)  # trusted as given
    found = find(tmp_path, [tmp_path / "bin"], GRPO_BROWSER=str(custom),
                 GRPO_CHROMEDRIVER=str(driver))
    assert (found.binary, found.driver, found.source) == (str(custom), str(driver),
                                                          "GRPO_CHROMEDRIVER")


def test_an_override_that_is_not_a_file_is_an_error(tmp_path):
    with pytest.raises(fb.BrowserNotFound, match="GRPO_BROWSER=/no/such/chrome is not"):
        find(tmp_path, [tmp_path / "bin"], GRPO_BROWSER="/no/such/chrome")


def test_no_browser_at_all_gives_one_line_naming_what_to_install(tmp_path, not_root):
    """Debian without root or passwordless sudo: nothing is installed, apt-get is named."""
    log, sudo_log = tmp_path / "apt.log", tmp_path / "sudo.log"
    fake(tmp_path / "bin" / "apt-get", body=f'{LOG_ARGS}{log}')
    fake(tmp_path / "bin" / "sudo", body=f"{LOG_ARGS}{sudo_log}; exit 1")  # wants a password
    with pytest.raises(fb.BrowserNotFound) as caught:
        find(tmp_path, [tmp_path / "bin"], install=True)
    message = str(caught.value)
    assert "\n" not in message and "no Chrome, Chromium or Edge found" in message
    assert "sudo apt-get install chromium chromium-driver" in message
    assert sudo_log.read_text().splitlines() == ["-n true"], "only the probe, no install"
    assert not log.exists(), "apt-get ran although it would have prompted"


def test_no_browser_and_no_package_manager(tmp_path, root):
    with pytest.raises(fb.BrowserNotFound) as caught:
        find(tmp_path, [tmp_path / "bin"], install=True)
    assert "Chromium or Google Chrome with its chromedriver" in str(caught.value)
    assert any("no package manager" in d for d in caught.value.details)


def _apt_get(tmp_path: Path, installs_into: Path) -> Path:
    """A fake apt-get that logs its arguments and, on install, puts chromium on the PATH."""
    log = tmp_path / "apt.log"
    body = (f'{LOG_ARGS}{log}\n'
            f'case " $* " in *" install "*)\n'
            f"  /bin/mkdir -p {installs_into}\n"
            f"  printf '#!/bin/sh\\necho \"{CHROMIUM}\"\\n' > {installs_into}/chromium\n"
            f"  printf '#!/bin/sh\\necho \"{DRIVER}\"\\n' > {installs_into}/chromedriver\n"
            f"  /bin/chmod +x {installs_into}/chromium {installs_into}/chromedriver;;\n"
            "esac")
    fake(tmp_path / "sbin" / "apt-get", body=body)
    return log


def test_root_on_debian_installs_chromium_with_apt_get(tmp_path, root):
    log = _apt_get(tmp_path, tmp_path / "usr-bin")
    found = find(tmp_path, [tmp_path / "sbin", tmp_path / "usr-bin"], install=True)
    assert found.binary == str(tmp_path / "usr-bin" / "chromium")
    assert log.read_text().splitlines() == [
        "update -qq", "install -y -qq --no-install-recommends chromium chromium-driver"]


def test_passwordless_sudo_installs_with_sudo_n(tmp_path, not_root):
    log = _apt_get(tmp_path, tmp_path / "usr-bin")
    sudo_log = tmp_path / "sudo.log"
    fake(tmp_path / "sbin" / "sudo", body=f'{LOG_ARGS}{sudo_log}\n[ "$1" = -n ] && shift\n'
                                          '[ "$1" = true ] && exit 0\nexec "$@"')
    find(tmp_path, [tmp_path / "sbin", tmp_path / "usr-bin"], install=True)
    assert all(line.startswith("-n ") for line in sudo_log.read_text().splitlines())
    assert "chromium chromium-driver" in log.read_text()


def test_without_install_nothing_is_installed(tmp_path, root):
    log = _apt_get(tmp_path, tmp_path / "usr-bin")
    with pytest.raises(fb.BrowserNotFound):
        find(tmp_path, [tmp_path / "sbin", tmp_path / "usr-bin"])
    assert not log.exists()


def test_fedora_installs_with_dnf(tmp_path, root):
    log = tmp_path / "dnf.log"
    fake(tmp_path / "bin" / "dnf", body=f'{LOG_ARGS}{log}; exit 1')  # a failing install
    with pytest.raises(fb.BrowserNotFound) as caught:
        find(tmp_path, [tmp_path / "bin"], install=True)
    assert log.read_text().split() == ["install", "-y", "-q", "chromium", "chromedriver"]
    assert "sudo dnf install chromium chromedriver" in str(caught.value)


def test_macos_chrome_app_in_the_home_applications_folder(tmp_path, root):
    """macOS: the app bundle is found outside the PATH, the driver from Homebrew's PATH."""
    app = tmp_path / "home" / "Applications" / "Google Chrome.app" / "Contents" / "MacOS"
    chrome = fake(app / "Google Chrome", CHROME)
    fake(tmp_path / "homebrew" / "chromedriver", DRIVER)
    fake(tmp_path / "homebrew" / "apt-get", body="exit 1")  # never used on macOS
    environ = {"PATH": str(tmp_path / "homebrew"), "HOME": str(tmp_path / "home")}
    found = fb.find_browser(install=True, env=environ, system="Darwin", driver_places=[],
                            selenium_manager=None)  # places: the macOS defaults under HOME
    assert found.binary == str(chrome) and found.kind == "chrome"


def test_macos_without_a_browser_names_homebrew(tmp_path, root):
    log = tmp_path / "apt.log"
    fake(tmp_path / "bin" / "apt-get", body=f'{LOG_ARGS}{log}')
    with pytest.raises(fb.BrowserNotFound) as caught:
        find(tmp_path, [tmp_path / "bin"], system="Darwin", install=True)
    assert "on macOS: brew install --cask google-chrome" in str(caught.value)
    assert not log.exists()


def test_standard_places_per_system(tmp_path):
    mac = fb.standard_places("Darwin", {"HOME": "/Users/me"})
    assert "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome" in mac
    assert "/Users/me/Applications/Chromium.app/Contents/MacOS/Chromium" in mac
    assert "/opt/google/chrome/chrome" in fb.standard_places("Linux", {})


@pytest.fixture
def bare_machine(tmp_path, monkeypatch, root):
    """The command line on a machine whose PATH and usual places hold no browser."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    for name in ("GRPO_BROWSER", "GRPO_CHROMEDRIVER", "CI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fb, "standard_places", lambda system, env: [])
    monkeypatch.setattr(fb, "standard_driver_places", lambda system: [])
    monkeypatch.setattr(fb, "default_selenium_manager", lambda: None)
    return tmp_path


def test_cli_without_a_browser_prints_one_line(bare_machine, capsys):
    assert fb.main(["--install"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("browser test: ")


def test_cli_with_ci_true_fails_loudly(bare_machine, capsys, monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert fb.main(["--install"]) == 1
    err = capsys.readouterr().err
    assert "CI=true and the browser test cannot run" in err
    assert "What was tried:" in err and "::error" in err and err.count("\n") > 4


def test_cli_reports_what_it_found(bare_machine, capsys):
    fake(bare_machine / "bin" / "chromium", CHROMIUM)
    fake(bare_machine / "bin" / "chromedriver", DRIVER)
    assert fb.main([]) == 0
    assert capsys.readouterr().out.startswith(f"== browser: {bare_machine}/bin/chromium")


def test_the_browser_test_fails_rather_than_skips_without_a_browser(monkeypatch):
    """tests/book/browser.py asks the same discovery and lets its error through."""
    from tests.book.browser import chromium

    monkeypatch.setenv("GRPO_BROWSER", "/no/such/browser")
    with pytest.raises(fb.BrowserNotFound), chromium():
        pass
