"""Atomic file writes: every file the trainer leaves behind is complete or absent.

Each writer puts the bytes in a temporary file in the destination folder, flushes
and fsyncs it, then moves it over the destination with ``os.replace``, which
is atomic on POSIX and Windows. An interrupted run therefore never leaves a
half-written CSV, JSON or checkpoint.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch


def _atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Read a CSV written by :func:`atomic_write_csv` as a list of string dicts."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def atomic_torch_save(path: str | os.PathLike[str], obj: Any) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically."""
    _atomic_write(Path(path), lambda handle: torch.save(obj, handle))
