"""Runs inside every chapter kernel (see :mod:`grpo_companion.book.kernel`).

:func:`install` counts the matplotlib figures each cell creates and appends one
JSON line per executed cell, ``{"execution_count": n, "figures": k}``, to the
file named by ``GRPO_BOOK_FIGURE_LOG``. The pipeline compares these counts
with the image outputs of the executed notebook, so that a cell which draws a
figure but shows nothing (as under a non-interactive backend) fails the build.
"""

from __future__ import annotations

import json
import os

_STATE = {"created": 0}


def _count_figures() -> None:
    from matplotlib.figure import Figure

    if getattr(Figure.__init__, "_grpo_counted", False):
        return
    original = Figure.__init__

    def counted_init(self, *args, **kwargs):
        _STATE["created"] += 1
        original(self, *args, **kwargs)

    counted_init._grpo_counted = True
    Figure.__init__ = counted_init


def install(shell=None) -> None:
    """Register the per-cell figure log in the running IPython kernel."""
    path = os.environ.get("GRPO_BOOK_FIGURE_LOG")
    if not path:
        return
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    _count_figures()

    def pre_run_cell(info) -> None:
        _STATE["created"] = 0

    def post_run_cell(result) -> None:
        count = result.execution_count
        if count is None:
            return
        with open(path, "a") as log:
            log.write(json.dumps({"execution_count": count, "figures": _STATE["created"]}) + "\n")
        _STATE["created"] = 0

    shell.events.register("pre_run_cell", pre_run_cell)
    shell.events.register("post_run_cell", post_run_cell)
