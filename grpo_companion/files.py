"""Atomic file writes: the one implementation behind the trainer's files (:mod:`.rl.io`), the
book's pages and notebooks (:mod:`.book.pipeline`, :mod:`.book.export`, :mod:`.book.student`)
and the TRL callback's records.

A file is written to a temporary beside it, made by ``tempfile.mkstemp`` (an unpredictable
name, never an existing file), flushed and fsynced, given the mode a plain ``open`` would give
it (``0o666`` less the umask, not ``mkstemp``'s ``0o600``), then moved over the destination with
``os.replace``, which is atomic on POSIX and Windows: the destination holds either its earlier
content or all of the new one. On any failure the temporary is removed. Each caller names its
temporaries (``prefix``, ``suffix``), since each cleans up after a killed process in its own
way.

The book writes through :func:`atomic_write` (and :func:`write_if_changed`): its temporaries
carry the writer's process id, so that a later write removes those of killed writers and no
one else's (:func:`remove_stale_temporaries`, :func:`sweep_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_write",
    "copy_if_changed",
    "new_file_mode",
    "remove_stale_temporaries",
    "sweep_stale_temporaries",
    "write_atomically",
    "write_if_changed",
]


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


# ------------------------------------------------------- the book's writers


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


#: a temporary of :func:`atomic_write`: ``.<name>.tmp-<pid>-<8 mkstemp characters>``
#: (or ``.<name>.tmp-<pid>``, as writers before mkstemp named it)
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>[0-9]+)(?:-[a-z0-9_]{8})?")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _stale_temporary(name: str, target: str | None = None) -> bool:
    """True for a temporary of :func:`atomic_write` (for ``target`` when given)
    whose writer process is gone."""
    match = _TEMPORARY.fullmatch(name)
    if match is None or (target is not None and match["name"] != target):
        return False
    pid = int(match["pid"])
    return pid != os.getpid() and not _process_alive(pid)


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries that killed writers of ``path`` left beside it
    (only names of :func:`atomic_write`'s own pattern, only of dead processes)."""
    pattern = os.path.join(glob.escape(str(path.parent)), glob.escape(_temporary_prefix(path)))
    for name in glob.glob(pattern + "*"):
        if _stale_temporary(os.path.basename(name), path.name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


def sweep_stale_temporaries(folder: Path) -> None:
    """:func:`remove_stale_temporaries` for every file under ``folder``."""
    for parent, _dirs, names in os.walk(folder):
        for name in names:
            if _stale_temporary(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(parent, name))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`grpo_companion.files.write_atomically`):
    ``path`` holds either its earlier content or all of ``data``, and the new file gets the
    mode a plain write would give it. The temporary's name carries this process's id, so that
    :func:`remove_stale_temporaries` (called first) can tell a dead writer's leftovers."""
    remove_stale_temporaries(path)
    write_atomically(path, lambda f: f.write(data),
                     prefix=f"{_temporary_prefix(path)}{os.getpid()}-")


def write_if_changed(path: Path, data: bytes) -> bool:
    """Atomically write ``data`` unless the file already holds it; True if written.

    Stale temporaries of earlier, killed calls for ``path`` are removed either way."""
    path = Path(path)
    if path.exists() and path.read_bytes() == data:
        remove_stale_temporaries(path)
        return False
    atomic_write(path, data)  # removes them too
    return True


def copy_if_changed(src: Path, dst: Path) -> bool:
    """:func:`write_if_changed` of ``dst`` with the bytes of ``src``; True if written."""
    return write_if_changed(dst, src.read_bytes())
