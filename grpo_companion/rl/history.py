"""Append-only metric history of a training run, so that a checkpoint costs the same every time.

The per-iteration metrics grow with the run, the rest of a checkpoint (policies,
optimiser, random state) does not. The trainer therefore appends each
iteration's metrics to ``history.bin`` as one fixed-size record of float64
values and keeps only the number of records and their SHA-256 digest in
``checkpoint.pt``; writing a checkpoint then costs the same at iteration 10
and at iteration 10 000. The final checkpoint of a run holds the whole history
itself, and ``history.bin`` is removed.

Crash safety: the records are flushed and fsynced before the checkpoint that
counts them is written. Records appended after the last checkpoint (the run
was interrupted or killed) are cut off when the run is resumed, and the digest
refuses a history file that no longer matches its checkpoint.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

HISTORY = "history.bin"


class HistoryError(ValueError):
    """``history.bin`` is missing, short or does not match the checkpoint."""


class MetricHistory:
    """Fixed-size float64 records: per-prompt metrics, then the iteration statistics.

    Parameters
    ----------
    path
        The history file.
    metrics, iteration_metrics
        Names of the per-prompt metrics and of the per-iteration statistics.
    n_tracked
        Number of tracked prompts (length of each per-prompt metric).
    """

    def __init__(self, path: Path, metrics: tuple[str, ...], iteration_metrics: tuple[str, ...],
                 n_tracked: int) -> None:
        self.path = Path(path)
        self.metrics, self.iteration_metrics = metrics, iteration_metrics
        self.n_tracked = n_tracked
        self.values_per_record = len(metrics) * n_tracked + 1 + len(iteration_metrics)
        self.record_bytes = 8 * self.values_per_record
        self.records = 0
        self._hash = hashlib.sha256()
        self._handle: IO[bytes] | None = None
        self._resumed: tuple[int, Any] = (0, hashlib.sha256())

    # ----------------------------------------------------------------- writing
    def start(self) -> None:
        """Create an empty history (a fresh run)."""
        self.close()
        self._handle = open(self.path, "wb")  # noqa: SIM115 - kept open for appends
        self.records = 0
        self._hash = hashlib.sha256()

    def append(self, metrics: dict[str, np.ndarray], row: dict[str, float] | None) -> None:
        """Append one iteration: its per-prompt ``metrics`` and its ``row`` (None for 0)."""
        assert self._handle is not None, "start() or resume() first"
        values = [np.asarray(metrics[m], dtype=np.float64).reshape(self.n_tracked)
                  for m in self.metrics]
        tail = [math.nan] * (1 + len(self.iteration_metrics))
        if row is not None:
            tail = [float(row["iteration"]), *(float(row[m]) for m in self.iteration_metrics)]
        record = np.concatenate([*values, np.asarray(tail)]).astype("<f8").tobytes()
        self._handle.write(record)
        self._hash.update(record)
        self.records += 1

    def sync(self) -> str:
        """Flush and fsync the records so far; returns their digest for the checkpoint."""
        assert self._handle is not None
        self._handle.flush()
        os.fsync(self._handle.fileno())
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    # ----------------------------------------------------------------- reading
    def read(self, records: int, digest: str) -> tuple[dict[str, list[np.ndarray]],
                                                       list[dict[str, float]]]:
        """Read and check the first ``records`` records (nothing is written).

        Returns the per-prompt metrics (one array per record) and the iteration
        rows (records 1 onwards). Raises :class:`HistoryError` if the file is
        missing, shorter than ``records`` or does not match ``digest``.
        """
        if not self.path.is_file():
            raise HistoryError(f"cannot resume: {str(self.path)!r} is missing (the checkpoint "
                               "keeps its metrics there)")
        need = records * self.record_bytes
        size = self.path.stat().st_size
        if size < need:
            raise HistoryError(
                f"cannot resume: {str(self.path)!r} holds {size} bytes, fewer than the "
                f"{need} of the {records} iterations in the checkpoint; it is truncated")
        with open(self.path, "rb") as handle:
            data = handle.read(need)
        hashed = hashlib.sha256(data)
        if hashed.hexdigest() != digest:
            raise HistoryError(f"cannot resume: {str(self.path)!r} does not match the checkpoint "
                               "(its digest differs); it was changed or corrupted")
        self._resumed = (records, hashed)
        table = np.frombuffer(data, dtype="<f8").reshape(records, self.values_per_record)
        return self.unpack(table)

    def continue_after_read(self) -> None:
        """Cut off the records after those :meth:`read` returned and open for appends."""
        records, hashed = self._resumed
        self.close()
        need = records * self.record_bytes
        if self.path.stat().st_size > need:  # iterations after the last checkpoint
            os.truncate(self.path, need)
        self._handle = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
        self.records, self._hash = records, hashed

    def unpack(self, table: np.ndarray) -> tuple[dict[str, list[np.ndarray]],
                                                 list[dict[str, float]]]:
        n = self.n_tracked
        metrics = {m: [table[r, i * n:(i + 1) * n].copy() for r in range(table.shape[0])]
                   for i, m in enumerate(self.metrics)}
        tail = table[:, len(self.metrics) * n:]
        rows = []
        for r in range(1, table.shape[0]):
            row: dict[str, float] = {"iteration": int(tail[r, 0])}
            row.update({m: float(tail[r, 1 + j]) for j, m in enumerate(self.iteration_metrics)})
            rows.append(row)
        return metrics, rows
