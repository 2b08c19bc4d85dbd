"""Fixtures shared by the trainer's tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one thread for the module (runs are then bit-for-bit repeatable on a CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
