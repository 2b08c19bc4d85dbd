"""Atomic file writes: the one implementation behind the trainer's files (:mod:`.rl.io`), the
book's pages and notebooks (:mod:`.book.pipeline`) and the TRL callback's records.

A file is written to a temporary beside it, made by ``tempfile.mkstemp`` (an unpredictable
name, never an existing file), flushed and fsynced, given the mode a plain ``open`` would give
it (``0o666`` less the umask, not ``mkstemp``'s ``0o600``), then moved over the destination with
``os.replace``, which is atomic on POSIX and Windows: the destination holds either its earlier
content or all of the new one. On any failure the temporary is removed. Each caller names its
temporaries (``prefix``, ``suffix``), since each cleans up after a killed process in its own
way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["new_file_mode", "write_atomically"]


def new_file_mode() -> int:
    """The mode of a newly created file: ``0o666`` less the process umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomically(path: str | os.PathLike[str], write: Callable[[IO[Any]], object], *,
                     prefix: str, suffix: str = "", text: bool = False) -> None:
    """Write ``path`` atomically with ``write(handle)`` (see the module docstring).

    ``handle`` is binary, or with ``text`` UTF-8 text without newline translation (as the
    ``csv`` module wants). The temporary is ``prefix + <random> + suffix`` in ``path``'s folder,
    which is created if missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        os.fchmod(fd, new_file_mode())
        with (os.fdopen(fd, "w", newline="", encoding="utf-8") if text
              else os.fdopen(fd, "wb")) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
