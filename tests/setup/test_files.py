"""grpo_companion.files.write_atomically: complete or absent, the mode of a plain write."""

from __future__ import annotations

import os
import stat

import pytest

from grpo_companion.files import new_file_mode, write_atomically


def test_writes_bytes_and_text_with_a_plain_files_mode(tmp_path):
    target = tmp_path / "new" / "out.bin"  # the folder is created
    write_atomically(target, lambda f: f.write(b"\x00\x01"), prefix=".out.")
    assert target.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(target.stat().st_mode) == new_file_mode()
    text = tmp_path / "rows.csv"
    write_atomically(text, lambda f: f.write("a,b\r\n1,2\r\n"), prefix=".rows.", text=True)
    assert text.read_bytes() == b"a,b\r\n1,2\r\n"  # no newline translation (csv's own)
    assert set(os.listdir(tmp_path)) == {"new", "rows.csv"}  # no temporary left
    assert os.listdir(tmp_path / "new") == ["out.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def half_then_fail(handle):
        handle.write(b"new, half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, half_then_fail, prefix=".out.txt.", suffix=".tmp")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_the_check_fails_on_a_write_in_place(tmp_path, monkeypatch):
    """Writing the destination directly (no temporary) loses the old content on a failure."""
    import grpo_companion.files as files

    def in_place(path, write, **_):
        with open(path, "wb") as handle:
            write(handle)

    monkeypatch.setattr(files, "write_atomically", in_place)
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(OSError):
        files.write_atomically(target, lambda f: (f.write(b"x"), (_ for _ in ()).throw(
            OSError("disk full"))), prefix=".out.")
    assert target.read_text() != "old"
