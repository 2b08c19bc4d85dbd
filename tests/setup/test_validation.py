"""The one scalar number check (``validation.is_real_number`` / ``check_number``) that the
trainer's losses and its configuration fields share, with the messages they gave before."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpo_companion.validation import check_number, is_real_number

torch = pytest.importorskip("torch")


def _before(value: object, low: float, high: float, open_low: bool = False) -> bool:
    """What ``rl.config._is_real`` (now ``rl.checks``) and ``rl.losses._check_real`` accepted
    (their two bodies, which were the same test written twice, before both called
    ``is_real_number``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return False
    return (value > low if open_low else value >= low) and value <= high


VALUES = [0, 1, 0.5, -0.0, 1.0, 2, -1e-300, 1e300, math.inf, -math.inf, math.nan, True, False,
          np.float64(0.3), np.float32(0.3), np.int64(1), np.array(0.3), [0.3], "0.3", None,
          1 + 0j]


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("low, high, open_low", [
    (0.0, 1.0, False), (0.0, 1.0, True), (0.0, math.inf, False), (0.0, math.inf, True),
    (-math.inf, math.inf, False), (0.0, 0.0, False), (math.inf, math.inf, False)])
def test_is_real_number_accepts_what_the_two_helpers_accepted(value, low, high, open_low):
    assert is_real_number(value, low, high, open_low=open_low) == _before(value, low, high,
                                                                          open_low)


@pytest.mark.parametrize("value, low, high, message", [
    (1.5, 0.0, 1.0, "alpha must be a number in [0.0, 1.0], got 1.5"),
    (True, 0.0, 1.0, "alpha must be a number in [0.0, 1.0], got True"),
    (math.nan, 0.0, math.inf, "alpha must be a number in [0.0, inf], got nan"),
    ("0.2", 0.0, 1.0, "alpha must be a number in [0.0, 1.0], got '0.2'"),
])
def test_check_number_message(value, low, high, message):
    with pytest.raises(ValueError) as info:
        check_number("alpha", value, low, high)
    assert str(info.value) == message
    check_number("alpha", 0.5, low, 1.0)  # accepted, returns None


def test_the_losses_messages_are_unchanged():
    from grpo_companion.rl import losses

    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    cases = [
        (dict(clip_eps_low=1.5), "clip_eps_low must be a number in [0.0, 1.0], got 1.5"),
        (dict(clip_eps_high=-0.1), "clip_eps_high must be a number in [0.0, inf], got -0.1"),
        (dict(beta=-1.0), "beta must be a number in [0.0, inf], got -1.0"),
        (dict(alpha=2), "alpha must be a number in [0.0, 1.0], got 2"),
    ]
    for keywords, message in cases:
        with pytest.raises(ValueError) as info:
            losses.per_token_loss(logp, logp, logp, adv, **keywords)
        assert str(info.value) == message


def test_the_config_fields_read_the_same_check():
    from grpo_companion.rl.checks import Real

    field = Real(low=0.0, high=1.0, open_low=True)
    assert field._accept(0.5) == (True, 0.5)
    assert not field._accept(0.0)[0] and not field._accept(math.nan)[0]
    assert not field._accept(True)[0] and not field._accept("0.5")[0]
    assert Real(low=1.0, or_zero=True)._accept(0)[0]
    assert Real(low=0.0, finite=True)._accept(math.inf)[0] is False
