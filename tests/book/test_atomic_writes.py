"""``write_if_changed`` writes through an unpredictable temporary (mkstemp) and
removes the stale temporaries of its own pattern that a killed writer left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_companion.book import pipeline
from grpo_companion.book.pipeline import REPO_ROOT, write_if_changed

KILLED_WRITER = """
import os, sys
from pathlib import Path
from grpo_companion.book import pipeline
os.replace = lambda *args: os._exit(9)  # killed between writing and renaming
pipeline.write_if_changed(Path(sys.argv[1]), b"half-done")
"""


def test_a_killed_writers_temporary_is_removed_by_the_next_call(tmp_path: Path) -> None:
    target = tmp_path / "page.txt"
    target.write_bytes(b"old")
    users = tmp_path / ".page.txt.tmp-notes"  # not of the pattern: never touched
    users.write_text("keep me")
    other = tmp_path / ".other.txt.tmp-1"  # another file's temporary: not this call's
    other.write_text("other")
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], cwd=REPO_ROOT)
    assert proc.returncode == 9
    leftovers = set(tmp_path.iterdir()) - {target, users, other}
    assert len(leftovers) == 1  # what a kill leaves behind
    assert write_if_changed(target, b"new")
    assert target.read_bytes() == b"new"
    assert set(tmp_path.iterdir()) == {target, users, other}
    assert users.read_text() == "keep me"


def test_write_if_changed_does_not_write_through_a_predictable_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "page.txt"
    (tmp_path / f".page.txt.tmp-{os.getpid()}").symlink_to(victim)
    assert write_if_changed(target, b"data")
    assert victim.read_text() == "precious"
    assert target.read_bytes() == b"data" and not target.is_symlink()
    assert not write_if_changed(target, b"data")


def test_a_failed_write_leaves_no_temporary(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "page.txt"

    def fail(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pipeline.os, "replace", fail)
    with pytest.raises(OSError):
        write_if_changed(target, b"data")
    assert list(tmp_path.iterdir()) == []
