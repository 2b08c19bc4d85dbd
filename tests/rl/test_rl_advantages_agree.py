"""The torch advantages of the trainer and the numpy ones of the theory's group
simulation are two implementations of one definition: they must agree."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from grpo_companion.rl import losses
from grpo_companion.theory import group_sampling
from grpo_companion.theory.calibration import EPS_PLACEMENTS, NORMALIZATIONS


@pytest.mark.parametrize(
    "normalization,eps_placement,ddof,eps",
    list(itertools.product(NORMALIZATIONS, EPS_PLACEMENTS, (0, 1), (0.0, 1e-4, 1e-2))),
)
def test_torch_and_numpy_group_advantages_agree(normalization, eps_placement, ddof, eps):
    rng = np.random.default_rng(0)
    rewards = (rng.random((200, 8)) < rng.random((200, 1))).astype(np.float64)
    rewards[:3] = [1.0] * 8, [0.0] * 8, [1.0] + [0.0] * 7  # constant groups included
    options = dict(normalization=normalization, eps=eps, eps_placement=eps_placement, ddof=ddof)
    torch_adv = losses.group_advantages(torch.from_numpy(rewards), **options).numpy()
    numpy_adv = group_sampling.group_advantages(rewards, **options)
    np.testing.assert_allclose(torch_adv, numpy_adv, rtol=1e-12, atol=1e-12)
    assert np.all(torch_adv[:2] == 0)  # all-equal groups carry no signal
