"""What this machine can hold: the one memory probe that the theory's and the trainer's
size checks share."""

from __future__ import annotations

import os

__all__ = ["memory_limit_bytes"]


def memory_limit_bytes() -> int:
    """This machine's physical memory in bytes (an upper bound for any one allocation)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - non-POSIX
        return 2**40
