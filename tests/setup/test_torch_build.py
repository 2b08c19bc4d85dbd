"""The torch build of ``make ... TORCH=auto|cpu|cuda`` (scripts/torch_build.py, Makefile)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ._load import ROOT, script

tb = script("torch_build")


def _machine(tmp_path: Path, *, smi: bool = False, proc: bool = False) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    driver = tmp_path / "proc" / "driver" / "nvidia"
    if proc:
        driver.mkdir(parents=True)
        (driver / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module 580.95\n")
    return {"path": str(bin_dir), "proc": driver}


@pytest.mark.parametrize("smi, proc, expected", [
    (False, False, "cpu"), (True, False, "cuda"), (False, True, "cuda"), (True, True, "cuda")])
def test_auto_follows_the_nvidia_driver(tmp_path, smi, proc, expected) -> None:
    assert tb.choose("auto", system="Linux", **_machine(tmp_path, smi=smi, proc=proc)) == expected


def test_explicit_choices_and_macos(tmp_path) -> None:
    gpu = _machine(tmp_path, smi=True, proc=True)
    assert tb.choose("cpu", system="Linux", **gpu) == "cpu"
    assert tb.choose("CUDA", system="Linux", **_machine(tmp_path)) == "cuda"
    assert tb.choose("auto", system="Darwin", **gpu) == "cpu"
    with pytest.raises(ValueError, match="no CUDA build for macOS"):
        tb.choose("cuda", system="Darwin")
    with pytest.raises(ValueError, match="choose one of auto, cpu, cuda"):
        tb.choose("gpu")


def test_auto_is_cpu_on_this_machine_when_it_has_no_nvidia_driver() -> None:
    here = Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi")
    assert tb.choose("auto") == ("cuda" if here else "cpu")


def test_requirements_per_build() -> None:
    cpu = tb.requirement("cpu", "2.13.0", system="Linux")
    assert cpu == ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"]
    assert tb.requirement("cuda", "2.13.0", system="Linux") == ["torch===2.13.0"]
    assert tb.requirement("cpu", "2.13.0", system="Darwin") == ["torch==2.13.0"]


def test_build_of_version_py() -> None:
    assert tb.build_of("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n") == "cpu"
    assert tb.build_of("__version__ = '2.13.0'\ncuda: Optional[str] = '13.0'\n") == "cuda"
    assert tb.build_of("cuda = '12.8'\n") == "cuda"


def test_the_lock_pins_torch_like_pyproject() -> None:
    version = tb.pinned_version(ROOT / "requirements.lock")
    assert f'"torch=={version}"' in (ROOT / "pyproject.toml").read_text()


def test_the_installed_torch_is_the_pinned_one() -> None:
    version, build = tb.installed()
    assert version.split("+")[0] == tb.pinned_version() and build in ("cpu", "cuda")


@pytest.fixture
def pip_calls(monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(tb, "_pip", lambda args: calls.append(list(args)) or 0)
    monkeypatch.setattr(tb.platform, "system", lambda: "Linux")
    return calls


def test_install_does_nothing_when_the_build_is_there(monkeypatch, pip_calls) -> None:
    monkeypatch.setattr(tb, "installed", lambda: ("2.13.0+cpu", "cpu"))
    assert tb.install("cpu") == 0 and pip_calls == []


def test_install_cpu_into_a_new_environment(monkeypatch, pip_calls) -> None:
    monkeypatch.setattr(tb, "installed", lambda: None)
    assert tb.install("cpu") == 0
    (call,) = pip_calls
    assert "--force-reinstall" not in call and call[-1] == f"torch=={tb.pinned_version()}+cpu"
    assert call[call.index("--extra-index-url") + 1] == tb.CPU_INDEX


def test_switching_from_cuda_to_cpu_removes_the_cuda_libraries(monkeypatch, pip_calls) -> None:
    monkeypatch.setattr(tb, "installed", lambda: ("2.13.0", "cuda"))
    monkeypatch.setattr(tb, "_cuda_leftovers", lambda: ["nvidia-cublas", "triton"])
    assert tb.install("cpu") == 0
    assert "--force-reinstall" in pip_calls[0]
    assert pip_calls[1] == ["uninstall", "--quiet", "-y", "nvidia-cublas", "triton"]


def test_switching_from_cpu_to_cuda(monkeypatch, pip_calls) -> None:
    monkeypatch.setattr(tb, "installed", lambda: ("2.13.0+cpu", "cpu"))
    assert tb.install("cuda") == 0
    (call,) = pip_calls
    assert "--force-reinstall" in call and "--extra-index-url" not in call
    assert call[-1] == f"torch==={tb.pinned_version()}"


def _make_databases(*torch: str) -> list[tuple[int, str, str]]:
    """(status, stdout, stderr) of ``make -n -p venv TORCH=...`` for each value, in parallel."""
    procs = [subprocess.Popen(["make", "-n", "-p", "venv", f"TORCH={t}"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for t in torch]
    outputs = [p.communicate(timeout=60) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_venv_stamp_carries_the_torch_build() -> None:
    results = _make_databases("auto", "cpu", "cuda", "gpu")
    stamps = {}
    for torch, (status, out, err) in zip(("auto", "cpu", "cuda"), results, strict=False):
        match = re.search(r"^STAMP := (\S+)$", out, re.MULTILINE)
        assert status == 0 and match, err
        stamps[torch] = match.group(1)
    assert stamps["cpu"] != stamps["cuda"]
    assert stamps["auto"] == stamps[tb.choose("auto")]
    assert results[-1][0] != 0 and "TORCH is auto, cpu or cuda" in results[-1][2]
