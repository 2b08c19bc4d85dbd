"""Atomic file writes: every file the trainer leaves behind is complete or absent.

Each writer puts the bytes in a temporary file ``.<name>.<random>.tmp`` in the
destination folder, flushes and fsyncs it, then moves it over the destination
with ``os.replace``, which is atomic on POSIX and Windows. An interrupted run
therefore never leaves a half-written CSV, JSON or checkpoint; a process killed
outright (SIGKILL) can leave the temporary file, which
:func:`remove_stale_temporaries` deletes when the run is resumed. Files get the
permissions of any newly created file (``0o666`` less the user's umask), not
the ``0o600`` of a bare temporary file.

Ctrl-C and SIGTERM that arrive during a write are held until the file is in
place, then delivered: an interrupt raised inside ``torch.save`` would
otherwise surface as the zip writer's ``RuntimeError`` instead of the
interrupt, and the run would be recorded as failed rather than interrupted.

One writer per folder: :class:`FolderLock` takes an exclusive ``flock`` on
``<folder>/.lock`` without waiting, so a second run on the same folder is
refused instead of mixing its files with the first's. The kernel drops the
lock when its process dies, so the file a killed run leaves locks nothing;
the lock file is removed when the lock is released.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from grpo_companion.files import write_atomically

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (Windows): no folder lock
    fcntl = None  # type: ignore[assignment]


def _temporary_prefix(name: str) -> str:
    return f".{name}."


_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver them.

    Only the main thread can set handlers; elsewhere, and for a signal whose
    handler was not set from Python (``getsignal`` gives ``None``), nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    previous = {sig: signal.getsignal(sig) for sig in _HELD_SIGNALS}
    previous = {sig: handler for sig, handler in previous.items() if handler is not None}
    for sig in previous:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):  # each held signal once, in order of arrival
            signal.raise_signal(sig)


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    with _signals_held():
        write_atomically(path, write, prefix=_temporary_prefix(Path(path).name), suffix=".tmp")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + ``os.replace``)."""
    _atomic_write(Path(path), lambda handle: handle.write(data))


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def format_value(value: Any) -> str:
    """CSV cell text: ``repr`` for floats (round-trips exactly), ``str`` otherwise."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def atomic_write_csv(
    path: str | os.PathLike[str],
    rows: Iterable[Mapping[str, Any]],
    fieldnames: Sequence[str],
) -> None:
    """Write tidy ``rows`` (one mapping per row) as CSV to ``path`` atomically.

    Floats are written with ``repr`` so that reading the file back gives the
    same float64 values bit for bit.
    """
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fieldnames), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: format_value(row[key]) for key in fieldnames})
    atomic_write_text(path, buffer.getvalue())


def atomic_torch_save(path: str | os.PathLike[str], obj: Any) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically."""
    _atomic_write(Path(path), lambda handle: torch.save(obj, handle))


def remove_stale_temporaries(folder: str | os.PathLike[str], names: Iterable[str]) -> list[Path]:
    """Delete the temporary files that atomic writes of ``names`` left in ``folder``.

    Only files named ``.<name>.<anything>.tmp`` for one of ``names`` are removed
    (what a process killed during a write leaves behind); returns their paths.
    """
    removed = []
    for name in names:
        for leftover in Path(folder).glob(f"{glob.escape(_temporary_prefix(name))}*.tmp"):
            if leftover.is_file() and not leftover.is_symlink():
                leftover.unlink()
                removed.append(leftover)
    return removed


LOCK_NAME = ".lock"


class FolderBusy(OSError):
    """Another process holds the lock of the folder."""


class FolderLock:
    """An exclusive, non-blocking ``flock`` on ``<folder>/.lock`` (see the module docstring).

    ``acquire()`` creates the folder if needed and raises :class:`FolderBusy`
    when another process (or another lock object of this one) holds it;
    :meth:`release` removes the lock file, then unlocks. A lock file that is
    unlinked by its holder between another process's ``open`` and ``flock``
    is detected (its inode is no longer the path's) and opened again, so two
    processes never both hold the folder.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                if fcntl is not None:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raise FolderBusy(f"{str(self.path.parent)!r} is in use by another "
                                         f"run (it holds {str(self.path)!r})") from None
                    try:
                        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                    except FileNotFoundError:
                        same = False
                    if not same:  # its holder removed it meanwhile: lock the new one
                        os.close(fd)
                        continue
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
            self._fd = fd
            return

    def release(self) -> None:
        """Remove the lock file and unlock (nothing if not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
