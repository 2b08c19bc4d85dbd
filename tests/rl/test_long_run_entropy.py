"""The exact entropy of each prompt's output distribution that long runs record.

:func:`grpo_companion.rl.long_run.exact_entropy` is checked on distributions whose entropy
is known, and the ``entropy_trained`` / ``entropy_held`` records of
:func:`~grpo_companion.rl.long_run.run_long` against the entropy computed here, directly,
from the model's own enumeration of every output at the recorded iterations (the batched
engine's records are compared with run_long's in ``test_seed_batch.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_companion.rl import long_run
from grpo_companion.rl.trainer import TrainConfig, prepare_run

# test_long_run's TINY, at a temperature other than 1 and with two iterations
TINY = TrainConfig.flat(task="sequence", max_operand=19, n_eval_prompts=16, eval_samples=4,
                        sft_steps=200, sft_batch_size=64, sft_lr=1e-2, d_model=16, n_heads=2,
                        n_layers=1, group_size=4, mu=2, iterations=2, prompts_per_iteration=4,
                        grpo_prompts=8, device="cpu", progress=False, lr=1e-3, kl="k3",
                        loss_type="dr_grpo", temperature=0.8)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ exact_entropy
def test_exact_entropy_of_known_distributions():
    n = 2955  # the addition task's outputs
    uniform = np.full((1, n), -math.log(n))
    point = np.full((1, n), -np.inf)
    point[0, 7] = 0.0
    two = np.log(np.array([[0.25, 0.75]]))
    # one output of probability about 1 - 1e-300 and many whose probabilities underflow
    tiny = np.full((1, 10_000), -800.0)
    tiny[0, 0] = 0.0
    np.testing.assert_allclose(long_run.exact_entropy(uniform), [math.log(n)], rtol=1e-13)
    assert long_run.exact_entropy(point).tolist() == [0.0]  # 0 log 0 counts as 0
    np.testing.assert_allclose(long_run.exact_entropy(two),
                               [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], rtol=1e-14)
    assert long_run.exact_entropy(tiny).tolist() == [0.0]
    rows = long_run.exact_entropy(np.concatenate([uniform, point]))
    np.testing.assert_allclose(rows, [math.log(n), 0.0], rtol=1e-13)


def test_exact_entropy_refuses_an_enumeration_that_is_not_of_every_output():
    lp = np.log(np.array([[0.5, 0.5], [0.5, 0.3]]))
    with pytest.raises(ValueError, match="row 1 sum to 0.8"):
        long_run.exact_entropy(lp)
    with pytest.raises(ValueError, match=r"\(prompts, outputs\) array"):
        long_run.exact_entropy(np.log([0.5, 0.5]))
    with pytest.raises(ValueError, match=r"\(prompts, outputs\) array"):
        long_run.exact_entropy(np.array([[0.0, np.nan]]))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_the_enumeration_sums_to_one_at_the_sampling_temperature(temperature):
    config = TINY.replace(temperature=temperature)
    run = prepare_run(config).run_state
    run.pretrain()
    lp, _, _ = long_run.exact_success(run.ref_policy, run.task, run.task.eval_idx, temperature)
    np.testing.assert_allclose(np.logaddexp.reduce(lp, axis=1), 0.0, atol=1e-12)
    entropy = long_run.exact_entropy(lp)
    assert np.all((entropy > 0) & (entropy < math.log(lp.shape[1])))


# ------------------------------------------------------------------ the records
def _direct_entropy(policy: torch.nn.Module, task, idx: np.ndarray) -> np.ndarray:
    """``-sum p log p`` over the model's own enumeration of every output, in torch."""
    with torch.no_grad():
        lp, outputs = policy.output_log_probs(task.prompts(torch.as_tensor(idx)),
                                              max_new_tokens=task.max_new_tokens,
                                              temperature=TINY.grpo.temperature)
    assert len(outputs) == lp.shape[1] == 2955
    return (-(lp.exp() * lp).sum(dim=1)).numpy()


def test_recorded_entropy_is_that_of_a_direct_enumeration():
    """The run again (same seed, one thread: the same numbers), its entropies taken here."""
    record_every = 1
    run = long_run.run_long(TINY, record_every=record_every)
    assert run.steps.tolist() == [0, 1, 2]
    assert run.entropy_trained.shape == (3, 8) and run.entropy_held.shape == (3, 16)
    prep = prepare_run(TINY.replace(eval_every=TINY.run.iterations))  # as run_long
    state = prep.run_state
    direct: list[tuple[np.ndarray, np.ndarray]] = []

    def measure(n: int = 0) -> None:
        if n % record_every == 0:
            direct.append((_direct_entropy(state.policy, state.task, run.trained),
                           _direct_entropy(state.policy, state.task, state.task.eval_idx)))

    prep.run(measure, on_start=measure)
    assert len(direct) == len(run.steps)
    for step, (trained, held) in enumerate(direct):
        np.testing.assert_allclose(run.entropy_trained[step], trained, rtol=1e-10, atol=0)
        np.testing.assert_allclose(run.entropy_held[step], held, rtol=1e-10, atol=0)
    # GRPO changed the trained prompts' distributions, so that the comparison means something
    assert np.abs(run.entropy_trained[-1] - run.entropy_trained[0]).max() > 1e-4
    assert np.all(run.entropy_held > 0)
