"""The callback's predicted path is stepped forward, not recomputed from iteration 0.

Recomputing it at every measurement cost N (N + 1) / 2 steps of the recurrence for N
measurements (71 s per measurement at 10^4 iterations with plain k3); stepping from the
last predicted state costs N, and gives the same numbers bit for bit.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from grpo_companion.practice import PoSProbeCallback, trl_bridge
from grpo_companion.practice.trl_bridge import predict_path, theory_reading
from grpo_companion.theory.calibration import Calibration

P_REF = np.array([0.0, 0.05, 0.3, 0.9, 1.0])

SETTINGS = {
    "forward": dict(beta=0.1, use_bias_correction_kl=True),
    "reverse": dict(beta=2.0, use_bias_correction_kl=False),
    "reverse, small beta": dict(beta=0.05, use_bias_correction_kl=False),
    "mean_only": dict(beta=0.5, scale_rewards="none"),
    "beta = 0": dict(beta=0.0),
    "no prediction": dict(beta=0.1, scale_rewards="batch"),
}


def _args(**changes):
    base = dict(num_generations=8, beta=0.1, scale_rewards="group", use_bias_correction_kl=True,
                gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
                max_completion_length=4)
    return SimpleNamespace(**{**base, **changes})


def _probe(counts):
    """A callback whose sampling is replaced by fixed success counts (out of 100)."""
    callback = PoSProbeCallback([f"p{i}" for i in range(len(counts))], lambda p, c: 1, None,
                                every=1, n_samples=100)
    callback._count_successes = lambda model, tokenizer, args, step: (
        np.asarray(counts, dtype=np.float64), 100)
    return callback


def _run(callback, args, steps):
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(), TrainerControl()
    kwargs = {"model": object(), "processing_class": object()}
    callback.on_train_begin(args, state, control, **kwargs)
    for step in steps:
        state.global_step = step
        callback.on_step_end(args, state, control, **kwargs)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_stepped_path_is_the_path_from_scratch_bit_for_bit(name):
    from grpo_companion.practice.trl_bridge import PredictedPath

    settings = theory_reading(_args(**SETTINGS[name]))
    path = PredictedPath(P_REF, settings)
    full = predict_path(P_REF, 40, settings)
    for n in (0, 1, 2, 2, 7, 8, 20, 40, 3, 0, 39):  # forward, repeated, and back again
        np.testing.assert_array_equal(path.at(n), full[n])
        np.testing.assert_array_equal(path.at(n), predict_path(P_REF, n, settings)[-1])
    with pytest.raises(ValueError, match="iteration"):
        path.at(-1)


@pytest.mark.parametrize("name", ["forward", "reverse"])
def test_the_callbacks_predictions_are_those_from_scratch(name):
    args = _args(**SETTINGS[name], num_iterations=2)  # one iteration every 2 steps
    callback = _probe([0, 5, 30, 90, 100])
    steps = [1, 2, 3, 5, 6, 11, 30, 31, 60]
    _run(callback, args, steps)
    settings = theory_reading(args)
    for step in [0, *steps]:
        rows = [r for r in callback.rows if r["step"] == step]
        iteration = rows[0]["theory_iteration"]
        assert iteration == step // 2
        expected = predict_path(P_REF, iteration, settings)[-1]
        np.testing.assert_array_equal([r["predicted_pos"] for r in rows], expected)


def _counting(monkeypatch, target, attribute):
    calls = []
    original = getattr(target, attribute)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, attribute, counted)
    return calls


@pytest.mark.parametrize(("name", "target", "attribute"), [
    ("reverse", trl_bridge, "_reverse_step"),  # one call per step of the reverse-KL map
    ("forward", Calibration, "omega_unchecked"),  # one call per step of theory.iterate
])
def test_the_recurrence_steps_grow_linearly_with_the_measurements(monkeypatch, name, target,
                                                                  attribute):
    n = 50
    args = _args(**SETTINGS[name])
    callback = _probe([10, 30, 90])
    _run(callback, args, [])  # the first measurement, which also computes the limits
    calls = _counting(monkeypatch, target, attribute)
    _run_more(callback, args, range(1, n + 1))
    assert len(callback.rows) == 3 * (n + 1)
    assert len(calls) == n  # from scratch: n (n + 1) / 2 = 1275


def _run_more(callback, args, steps):
    from transformers import TrainerControl, TrainerState

    state, control = TrainerState(), TrainerControl()
    kwargs = {"model": object(), "processing_class": object()}
    for step in steps:
        state.global_step = step
        callback.on_step_end(args, state, control, **kwargs)
