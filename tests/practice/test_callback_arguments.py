"""PoSProbeCallback refuses, when it is made, arguments that would go wrong later.

Each of these once passed construction and then probed single characters, aborted the
user's TRL training at the first measurement, or wrote the plot over the CSV.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from grpo_companion.practice import PoSProbeCallback

from .test_trl_callback import says_target


@pytest.mark.parametrize("prompts", ["say A", b"say A"])
def test_a_single_string_is_not_a_list_of_prompts(tmp_path, prompts):
    with pytest.raises(ValueError, match=r"prompts must be a list.*not a single string"):
        PoSProbeCallback(prompts, says_target, tmp_path)


def test_a_mapping_is_not_a_list_of_prompts(tmp_path):
    with pytest.raises(ValueError, match="prompts must be a list"):
        PoSProbeCallback({"say A": 1}, says_target, tmp_path)


@pytest.mark.parametrize(("prompts", "index"), [
    (["say A", ""], 1), (["   "], 0), (["say A", []], 1), (["say A", 3], 1),
    ([[{"role": "user", "content": "say A"}], [{"role": "user", "content": ""}]], 1),
    ([[{"content": "say A"}]], 0),
])
def test_an_empty_or_malformed_prompt_is_refused(tmp_path, prompts, index):
    with pytest.raises(ValueError, match=rf"prompts\[{index}\]"):
        PoSProbeCallback(prompts, says_target, tmp_path)


def test_conversations_are_accepted(tmp_path):
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A"}]
    callback = PoSProbeCallback([conversation, ("say B")], says_target, tmp_path)
    assert callback.prompts == [conversation, "say B"]


def test_an_out_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ValueError, match="out_dir .*is a file"):
        PoSProbeCallback(["say A"], says_target, tmp_path / "taken")
    with pytest.raises(ValueError, match="out_dir .*is a file"):  # a file above it, too
        PoSProbeCallback(["say A"], says_target, tmp_path / "taken" / "probe")


def _unwritable_dir(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (chmod 555; root ignores that: /sys)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    for candidate in (folder, Path("/sys"), Path("/proc")):
        try:
            fd, name = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(name)
    pytest.skip("no folder here refuses writes to this process")


def test_a_read_only_out_dir_is_refused(tmp_path):
    folder = _unwritable_dir(tmp_path)
    try:
        with pytest.raises(ValueError, match="out_dir .*not writable"):
            PoSProbeCallback(["say A"], says_target, folder)
        with pytest.raises(ValueError, match="out_dir .*not writable"):  # to be made inside it
            PoSProbeCallback(["say A"], says_target, folder / "probe" / "run1")
    finally:
        (tmp_path / "read-only").chmod(stat.S_IRWXU)


def test_a_writable_out_dir_is_not_created_at_construction(tmp_path):
    PoSProbeCallback(["say A"], says_target, tmp_path / "new" / "probe")
    assert list(tmp_path.iterdir()) == []  # only the main process makes it, when it writes


@pytest.mark.parametrize("names", [
    {"csv_name": "out.x", "plot_name": "out.x"},
    {"plot_name": "pos_probe.json"},
    {"csv_name": "a/../pos_probe.png"},
])
def test_two_outputs_on_one_path_are_refused(tmp_path, names):
    with pytest.raises(ValueError, match=r"(csv|plot|record)_name"):
        PoSProbeCallback(["say A"], says_target, tmp_path, **names)


@pytest.mark.parametrize("name", ["", ".", "sub/"])
def test_an_output_name_must_name_a_file(tmp_path, name):
    with pytest.raises(ValueError, match="csv_name"):
        PoSProbeCallback(["say A"], says_target, tmp_path, csv_name=name)


def test_without_an_out_dir_nothing_is_checked_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pos_probe.csv").write_text("mine")  # refused with out_dir=tmp_path
    callback = PoSProbeCallback(["say A"], says_target, None)
    assert not callback.writes_files
