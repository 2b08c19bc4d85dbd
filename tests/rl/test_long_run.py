"""Long runs with exact PoS (chapter 8): enumeration of outputs, the GRPO pool, run_long.

The enumeration of every completion on the KV cache
(:meth:`TinyCausalTransformer.output_log_probs`) is checked against full
forward passes and against Monte Carlo with the task's verifier; the records
of :func:`grpo_companion.rl.long_run.run_long` against the prompts each
iteration trained and against the tabular optimum worked out by hand.

Every test runs torch on one thread: the runs are then bit-for-bit those of
:func:`run_seeds`'s worker processes (which use one thread), and the tiny
models are fastest that way.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy.special import expit

from grpo_companion.rl import long_run, tasks
from grpo_companion.rl.policies import TinyCausalTransformer
from grpo_companion.rl.trainer import TrainConfig, prepare_run
from grpo_companion.theory import Calibration
from grpo_companion.theory.analyses import trained_loss as tl

# pre-trained long enough that groups of 4 see successes, so that GRPO moves the policy
TINY = TrainConfig.flat(task="sequence", max_operand=19, n_eval_prompts=16, eval_samples=4,
                        sft_steps=200, sft_batch_size=64, sft_lr=1e-2, d_model=16, n_heads=2,
                        n_layers=1,
                        group_size=4, mu=2, iterations=4, prompts_per_iteration=4, grpo_prompts=8,
                        device="cpu", progress=False, lr=1e-3, kl="k3", loss_type="dr_grpo")
LONG_FIELDS = ("trained", "held_out", "operands_trained", "operands_held", "steps",
               "logit_trained", "logit_held", "entropy_trained", "entropy_held", "delta",
               "delta_pos", "target_logit", "orbit_tv", "orbit_logit", "beta_trained",
               "group_successes")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def task():
    return tasks.make_arithmetic_task(max_operand=19, n_eval_prompts=16)


@pytest.fixture(scope="module")
def sft_policy(one_torch_thread):
    """A reference policy trained long enough that some prompts succeed often."""
    config = TrainConfig.flat(task="sequence", max_operand=19, n_eval_prompts=16, sft_steps=200,
                              sft_batch_size=64, sft_lr=1e-2, d_model=16, n_heads=2, n_layers=1,
                              device="cpu", progress=False)
    prep = prepare_run(config)
    prep.run_state.pretrain()
    return prep.run_state.ref_policy, prep.run_state.task


def _random_model(vocab: int, max_len: int, *, n_layers: int = 2, seed: int = 0,
                  scale: float = 1.0) -> TinyCausalTransformer:
    """An untrained model, its weights times ``scale`` (its distributions are far from uniform)."""
    torch.manual_seed(seed)
    model = TinyCausalTransformer(vocab, max_len, d_model=16, n_layers=n_layers, n_heads=2,
                                  eos_id=vocab - 1, pad_id=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


def _brute_log_prob(model: TinyCausalTransformer, prompt: torch.Tensor,
                    output: tuple[int, ...], temperature: float) -> float:
    """log pi(output | prompt) from one full forward pass (no cache)."""
    tokens = torch.cat([prompt, torch.tensor(output, dtype=prompt.dtype)]).unsqueeze(0)
    with torch.no_grad():
        logits = model(tokens[:, :-1])[0].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(prompt) - 1
    return float(sum(logp[start + t, tok] for t, tok in enumerate(output)))


def _count(vocab: int, t: int) -> int:
    return sum((vocab - 1) ** length for length in range(t)) + (vocab - 1) ** t


# ------------------------------------------------------------------ output_log_probs
@pytest.mark.parametrize(("vocab", "t", "temperature"), [
    (5, 1, 1.0), (5, 3, 1.0), (4, 4, 0.7), (6, 2, 1.6),
])
def test_every_output_enumerated_once_and_probabilities_sum_to_one(vocab, t, temperature):
    model = _random_model(vocab, 3 + t)
    prompts = torch.tensor([[1, 2, 0], [2, 2, 1], [0, 1, 2]])
    log_probs, outputs = model.output_log_probs(prompts, max_new_tokens=t,
                                                temperature=temperature)
    assert log_probs.dtype == torch.float64
    assert log_probs.shape == (3, len(outputs)) and len(outputs) == _count(vocab, t)
    assert len(set(outputs)) == len(outputs)
    eos = vocab - 1
    for o in outputs:  # up to the first EOS, which ends it; or t tokens without EOS
        assert eos not in o[:-1]
        assert (o[-1] == eos and len(o) <= t) or (len(o) == t and eos not in o)
    np.testing.assert_allclose(log_probs.exp().sum(dim=1).numpy(), 1.0, rtol=1e-6)
    assert torch.all(log_probs <= 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("n_layers", [1, 2, 3])
@pytest.mark.parametrize(("dtype", "scale", "tol"), [
    (torch.float32, 1.0, 1e-5),
    (torch.float64, 4.0, 1e-11),  # float32 rounding grows with the weights; float64 does not
], ids=["float32", "float64"])
def test_enumeration_matches_full_forward_passes(temperature, n_layers, dtype, scale, tol):
    model = _random_model(6, 7, n_layers=n_layers, seed=n_layers, scale=scale).to(dtype)
    prompts = torch.tensor([[1, 2, 0, 3], [4, 4, 1, 0]])
    log_probs, outputs = model.output_log_probs(prompts, max_new_tokens=3,
                                                temperature=temperature)
    rng = np.random.default_rng(0)
    columns = [0, len(outputs) - 1, *rng.choice(len(outputs), 12, replace=False)]
    columns += [outputs.index(o) for o in outputs if len(o) == 2][:2]  # one token, then EOS
    for row, prompt in enumerate(prompts):
        for c in columns:
            brute = _brute_log_prob(model, prompt, outputs[c], temperature)
            assert float(log_probs[row, c]) == pytest.approx(brute, abs=tol), outputs[c]
    # the distribution is far from uniform, so that the comparison means something
    assert float(log_probs.max() - log_probs.min()) > 5


def test_enumeration_on_the_addition_task(task, sft_policy):
    policy, _ = sft_policy
    idx = task.eval_idx[:3]
    log_probs, outputs = policy.output_log_probs(task.prompts(torch.as_tensor(idx)),
                                                 max_new_tokens=task.max_new_tokens)
    assert task.max_new_tokens == 3 and len(outputs) == _count(tasks.VOCAB_SIZE, 3) == 2955
    np.testing.assert_allclose(log_probs.exp().sum(dim=1).numpy(), 1.0, rtol=1e-6)
    prompts = task.prompts(torch.as_tensor(idx))
    best = log_probs.argmax(dim=1)
    for row in range(3):
        for c in (int(best[row]), 0, 100, 2954):
            brute = _brute_log_prob(policy, prompts[row], outputs[c], 1.0)
            assert float(log_probs[row, c]) == pytest.approx(brute, abs=1e-5)


@pytest.mark.parametrize("t", [0, -1, 5])
def test_max_new_tokens_out_of_range_is_refused(t):
    model = _random_model(5, 7)
    with pytest.raises(ValueError, match="max_new_tokens must be in"):
        model.output_log_probs(torch.tensor([[1, 2, 0]]), max_new_tokens=t)
    with pytest.raises(ValueError, match="temperature"):
        model.output_log_probs(torch.tensor([[1, 2, 0]]), max_new_tokens=2, temperature=0.0)


def test_sibling_entries_each_see_only_the_past_and_themselves():
    model = _random_model(6, 8, n_layers=1)
    block = model.blocks[0]
    torch.manual_seed(1)
    past_x = torch.randn(2, 4, 16)
    with torch.no_grad():
        _, past = block.extend(past_x, None)
        siblings = torch.randn(2, 3, 16)
        together, (k, v) = block.extend(siblings, past, siblings=True)
        assert together.shape == (2, 3, 16) and k.shape[2] == 4 + 3
        for i in range(3):
            alone, (k1, v1) = block.extend(siblings[:, i:i + 1], past)
            torch.testing.assert_close(together[:, i:i + 1], alone, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(k[:, :, 4 + i], k1[:, :, 4], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(v[:, :, 4 + i], v1[:, :, 4], rtol=1e-6, atol=1e-7)
        # without siblings the new entries are consecutive positions (causal among themselves)
        causal, _ = block.extend(siblings, past)
        assert not torch.allclose(causal[:, 1:], together[:, 1:])
        torch.testing.assert_close(causal[:, :1], together[:, :1], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ exact_success
def test_exact_success_is_the_log_odds_of_the_correct_output(task, sft_policy):
    policy, _ = sft_policy
    idx = task.eval_idx
    lp, col, logit = long_run.exact_success(policy, task, idx, 1.0)
    _, outputs = policy.output_log_probs(task.prompts(torch.as_tensor(idx[:1])),
                                         max_new_tokens=task.max_new_tokens)
    assert lp.shape == (len(idx), len(outputs)) and col.shape == logit.shape == (len(idx),)
    for row, q in enumerate(idx):  # the readable verifier accepts that one column only
        a, b = (int(x) for x in task.operands[q])
        accepted = [c for c, o in enumerate(outputs) if tasks.check_answer(a, b, list(o))]
        assert accepted == [col[row]]
    p = np.exp(lp[np.arange(len(idx)), col])
    np.testing.assert_allclose(logit, np.log(p) - np.log1p(-p), rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(long_run.correct_columns(task, idx, outputs), col)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_success_matches_monte_carlo(task, sft_policy, temperature):
    policy, _ = sft_policy
    _, _, logit_all = long_run.exact_success(policy, task, task.eval_idx, temperature)
    idx = task.eval_idx[np.argsort(logit_all)[-3:]]  # the prompts that succeed most
    _, _, logit = long_run.exact_success(policy, task, idx, temperature)
    p = 1 / (1 + np.exp(-logit))
    assert np.all(p > 0.03)
    n = 4000
    generator = torch.Generator().manual_seed(7)
    prompts = task.prompts(torch.as_tensor(idx))
    completions, mask = policy.sample(prompts, n, max_new_tokens=task.max_new_tokens,
                                      temperature=temperature, generator=generator)
    rewards = task.reward(torch.as_tensor(idx), completions, mask, n).reshape(len(idx), n)
    observed = rewards.double().mean(dim=1).numpy()
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(observed - p) < 4 * se), (observed, p, se)


# ------------------------------------------------------------------ the GRPO pool
def test_grpo_pool_is_a_seeded_sorted_subset(task):
    pool = task.grpo_pool(8, 0)
    assert pool.shape == (8,) and np.all(np.diff(pool) > 0)
    assert set(pool) <= set(task.train_idx) and not set(pool) & set(task.eval_idx)
    np.testing.assert_array_equal(pool, task.grpo_pool(8, 0))
    assert not np.array_equal(pool, task.grpo_pool(8, 1))
    np.testing.assert_array_equal(task.grpo_pool(None, 3), task.train_idx)
    everything = task.grpo_pool(len(task.train_idx), 5)
    np.testing.assert_array_equal(everything, task.train_idx)
    # a larger pool of the same seed extends the smaller one (the first of one shuffle)
    assert set(pool) <= set(task.grpo_pool(20, 0))


@pytest.mark.parametrize("count", [0, -3, 385, 2.0, True, "8"])
def test_grpo_pool_refuses_bad_counts(task, count):
    assert len(task.train_idx) == 384
    with pytest.raises(ValueError, match="count must be None or an int in"):
        task.grpo_pool(count, 0)


def test_config_checks_grpo_prompts():
    base = TINY.to_dict()
    TrainConfig.flat(**{**base, "grpo_prompts": 384})
    TrainConfig.flat(**{**base, "grpo_prompts": None, "prompts_per_iteration": 384})
    for bad in (385, 0):
        with pytest.raises(ValueError, match="grpo_prompts"):
            TrainConfig.flat(**{**base, "grpo_prompts": bad})
    with pytest.raises(ValueError, match="prompts_per_iteration"):
        TrainConfig.flat(**{**base, "grpo_prompts": 8, "prompts_per_iteration": 9})
    TrainConfig.flat(**{**base, "grpo_prompts": 8, "prompts_per_iteration": 8})


def _chosen_per_iteration(config: TrainConfig, keep_policy_at: int | None = None):
    """The prompts of every iteration of ``config`` (and a copy of the policy after one)."""
    prep = prepare_run(config)
    chosen, kept = [], {}

    def callback(n: int) -> None:
        chosen.append(prep.run_state.chosen.cpu().numpy().copy())
        if n == keep_policy_at:
            kept["policy"] = copy.deepcopy(prep.run_state.policy)

    prep.run(callback)
    return chosen, kept.get("policy"), prep.run_state


def test_grpo_trains_only_on_its_pool():
    config = TINY.replace(iterations=6, sft_steps=2)
    chosen, _, run = _chosen_per_iteration(config)
    pool = run.task.grpo_pool(8, config.run.seed)
    assert len(chosen) == 6
    for batch in chosen:
        assert len(batch) == 4 and len(set(batch)) == 4 and set(batch) <= set(pool)
    assert len(set(np.concatenate(chosen))) > 4  # the batches differ
    # without grpo_prompts the batches come from every training prompt
    free, _, run = _chosen_per_iteration(config.replace(grpo_prompts=None))
    assert not set(np.concatenate(free)) <= set(pool)
    assert set(np.concatenate(free)) <= set(run.task.train_idx)


# ------------------------------------------------------------------ run_long
@pytest.fixture(scope="module")
def long(one_torch_thread):
    return long_run.run_long(TINY, record_every=3)


def test_run_long_shapes(long):
    k, h = 8, 16
    assert long.steps.tolist() == [0, 3, 4]
    assert long.trained.shape == (k,) and long.held_out.shape == (h,)
    assert long.operands_trained.shape == (k, 2) and long.operands_held.shape == (h, 2)
    assert long.logit_trained.shape == (3, k) and long.logit_held.shape == (3, h)
    assert long.entropy_trained.shape == (3, k) and long.entropy_held.shape == (3, h)
    assert np.all(np.isfinite(long.entropy_trained)) and np.all(np.isfinite(long.entropy_held))
    for name in ("delta", "delta_pos", "target_logit", "orbit_tv", "orbit_logit"):
        assert getattr(long, name).shape == (TINY.run.iterations, k)
    assert np.all(np.isfinite(long.logit_trained)) and np.all(np.isfinite(long.logit_held))
    assert long.config.run.iterations == TINY.run.iterations and long.config.run.progress is False
    assert math.isfinite(long.sft_loss)
    assert long.train_seconds > 0 and long.record_seconds > 0


def test_run_long_records_the_pool_and_the_held_out_prompts(long, task):
    np.testing.assert_array_equal(long.trained, task.grpo_pool(8, TINY.run.seed))
    np.testing.assert_array_equal(long.held_out, task.eval_idx)
    np.testing.assert_array_equal(long.operands_trained, task.operands[long.trained])
    np.testing.assert_array_equal(long.operands_held, task.operands[long.held_out])


def test_run_long_distances_exist_exactly_for_the_batch(long):
    config = TINY.replace(eval_every=TINY.run.iterations)  # as run_long trains it
    chosen, policy_1, run = _chosen_per_iteration(config, keep_policy_at=1)
    position = {int(q): i for i, q in enumerate(long.trained)}
    for n, batch in enumerate(chosen):
        in_batch = np.zeros(len(long.trained), dtype=bool)
        in_batch[[position[int(q)] for q in batch]] = True
        for name in ("delta", "delta_pos", "target_logit"):
            row = getattr(long, name)[n]
            np.testing.assert_array_equal(np.isfinite(row), in_batch)
            assert np.sum(np.isfinite(row)) == TINY.grpo.prompts_per_iteration
    finite = np.isfinite(long.delta)
    assert np.all((long.delta[finite] >= 0) & (long.delta[finite] <= 1))
    assert np.all(long.delta[finite] >= long.delta_pos[finite])
    assert np.all(long.delta_pos[finite] >= 0)

    # iteration 1 by hand: pi_prev = pi_ref, the k3 optimum at G = 4, then the TV
    cols = [position[int(q)] for q in chosen[0]]
    lp_ref, col, logit_ref = long_run.exact_success(run.ref_policy, run.task, chosen[0],
                                                    TINY.grpo.temperature)
    goal = tl.exact_step_logit(logit_ref, logit_ref, TINY.grpo.beta, estimator="k3",
                               calibration=Calibration(group_size=4))
    np.testing.assert_allclose(long.target_logit[0, cols], goal, rtol=1e-10, atol=1e-10)
    lp_new = long_run.exact_success(policy_1, run.task, chosen[0], TINY.grpo.temperature)[0]
    p_star = 1 / (1 + np.exp(-goal))
    ref = np.exp(lp_ref)
    rows = np.arange(len(cols))
    fail = ref.copy()
    fail[rows, col] = 0.0
    star = (1 - p_star)[:, None] * fail / fail.sum(axis=1, keepdims=True)
    star[rows, col] = p_star
    tv = 0.5 * np.abs(np.exp(lp_new) - star).sum(axis=1)
    np.testing.assert_allclose(long.delta[0, cols], tv, rtol=1e-8, atol=1e-12)
    pos = 0.5 * np.abs(np.exp(lp_new[rows, col]) - p_star)
    np.testing.assert_allclose(long.delta_pos[0, cols], pos, rtol=1e-8, atol=1e-12)


def test_group_successes_are_the_trainers_rewards_of_the_batch(long):
    """group_successes[n, j]: successes among prompt j's G samples at iteration n+1."""
    config = TINY.replace(eval_every=TINY.run.iterations)  # as run_long trains it
    prep = prepare_run(config)
    seen = []
    prep.run(lambda n: seen.append((prep.run_state.chosen.cpu().numpy().copy(),
                                    prep.run_state.rewards.sum(1).cpu().numpy().copy())))
    position = {int(q): i for i, q in enumerate(long.trained)}
    assert long.group_successes.shape == (TINY.run.iterations, len(long.trained))
    for n, (batch, successes) in enumerate(seen):
        row = np.full(len(long.trained), np.nan)
        row[[position[int(q)] for q in batch]] = successes
        np.testing.assert_array_equal(long.group_successes[n], row)
    finite = long.group_successes[np.isfinite(long.group_successes)]
    assert np.all((finite >= 0) & (finite <= TINY.grpo.group_size) & (finite == np.round(finite)))
    assert 0 < finite.sum() < finite.size * TINY.grpo.group_size  # some successes, some failures


def test_orbit_distance_is_theorem_10s_and_obeys_the_triangle_inequality():
    """D_n = TV(pi~_n, pi_n) against the exact orbit from pi_ref (the paper's Assumption 1).

    pi~_0 = pi_0 = pi_ref, so D_1 is the one-step delta_1. After that, exactly,
    D_n <= delta_n + TV(T pi~_{n-1}, T pi_{n-1}) = delta_n + |T(p~_{n-1}) - T(p_{n-1})|,
    because both steps put their PoS on the correct output and the rest in pi_ref's
    failure proportions; that is the contraction argument of chapter 8.
    """
    full = TINY.replace(prompts_per_iteration=8, iterations=5)
    run = long_run.run_long(full, record_every=5)
    cal = Calibration(group_size=4)
    lr = run.logit_trained[0]
    orbit = lr
    for n in range(full.run.iterations):  # the orbit, iterated here from pi_ref's logits
        orbit = tl.exact_step_logit(orbit, lr, full.grpo.beta, estimator="k3", calibration=cal)
        np.testing.assert_allclose(run.orbit_logit[n], orbit, rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(run.orbit_tv))
    np.testing.assert_allclose(run.orbit_tv[0], run.delta[0], rtol=1e-12, atol=1e-15)
    step_gap = np.abs(expit(run.target_logit) - expit(run.orbit_logit))
    assert np.all(run.orbit_tv <= run.delta + step_gap + 1e-12)
    assert np.all(run.orbit_tv[1:] > 0)


def test_per_prompt_beta_reaches_the_recorded_steps_and_orbits():
    """With grpo_beta_multipliers every recorded step uses the prompt's own KL weight."""
    mult = (1.0, 3.0, 10.0)
    config = TINY.replace(prompts_per_iteration=8, iterations=3,
                          grpo_beta_multipliers=mult)
    run = long_run.run_long(config, record_every=3)
    beta = config.grpo.beta * np.resize(mult, 8)  # grpo_pool's order, multipliers cycled
    np.testing.assert_array_equal(run.beta_trained, beta)
    cal = Calibration(group_size=4)
    lr = run.logit_trained[0]
    np.testing.assert_allclose(run.orbit_logit[0], tl.exact_step_logit(
        lr, lr, beta, estimator="k3", calibration=cal), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(run.target_logit[0], run.orbit_logit[0], rtol=1e-12, atol=1e-12)
    one_beta = tl.exact_step_logit(lr, lr, config.grpo.beta, estimator="k3", calibration=cal)
    assert np.abs(run.orbit_logit[0] - one_beta).max() > 0.1  # the weights matter


def test_run_long_starts_at_the_reference(long):
    prep = prepare_run(TINY)
    prep.run_state.pretrain()
    ref, task = prep.run_state.ref_policy, prep.run_state.task
    for idx, logits in ((long.trained, long.logit_trained), (long.held_out, long.logit_held)):
        expected = long_run.exact_success(ref, task, idx, TINY.grpo.temperature)[2]
        np.testing.assert_allclose(logits[0], expected, rtol=1e-12, atol=1e-12)
    # GRPO moved the trained prompts
    assert not np.array_equal(long.logit_trained[-1], long.logit_trained[0])


def _assert_same(a: long_run.LongRun, b: long_run.LongRun) -> None:
    for name in LONG_FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.sft_loss == b.sft_loss and a.config == b.config


def test_run_long_is_deterministic_and_workers_agree(long):
    again = long_run.run_long(TINY, record_every=3)
    _assert_same(long, again)
    seed_1 = long_run.run_long(TINY.replace(seed=1), record_every=3)
    assert not np.array_equal(seed_1.trained, long.trained)
    in_workers = long_run.run_seeds(TINY, [0, 1], record_every=3, workers=2)
    assert [r.config.run.seed for r in in_workers] == [0, 1]
    _assert_same(in_workers[0], long)
    _assert_same(in_workers[1], seed_1)


@pytest.mark.parametrize("every", [0, -1, 1.5, True, "2", None])
def test_run_long_refuses_bad_record_every(every):
    with pytest.raises(ValueError, match="record_every must be an int >= 1"):
        long_run.run_long(TINY, record_every=every)


@pytest.mark.parametrize("config", [
    TrainConfig.flat(progress=False),
    TINY.replace(grpo_prompts=None),
], ids=["bandit", "no_pool"])
def test_run_long_refuses_other_runs(config):
    with pytest.raises(ValueError, match="config must be a sampled task='sequence' run"):
        long_run.run_long(config)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_run_seeds_refuses_bad_workers(workers):
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        long_run.run_seeds(TINY, [0], workers=workers)


def test_run_long_keeps_the_trainers_own_numbers(long):
    """Clip fractions of every iteration, the sampled held-out PoS, and the output count."""
    config = long.config
    assert long.clip_fraction.shape == (config.run.iterations,)
    assert np.all((long.clip_fraction >= 0) & (long.clip_fraction <= 1))
    assert long.sampled_held.shape == (2, config.sequence.n_eval_prompts)
    # the trainer's eval_samples-sample estimates are multiples of 1 / eval_samples
    np.testing.assert_allclose(long.sampled_held * config.sequence.eval_samples,
                               np.round(long.sampled_held * config.sequence.eval_samples),
                               atol=1e-9)
    vocab_but_eos = 14  # 15 tokens, EOS excluded
    assert long.n_outputs == 1 + vocab_but_eos + vocab_but_eos**2 + vocab_but_eos**3


def test_on_start_runs_once_after_pretraining_and_before_the_first_iteration():
    from grpo_companion.rl.trainer import prepare_run

    prep = prepare_run(TINY)
    events: list[object] = []

    def on_start() -> None:
        run = prep.run_state
        pairs = zip(run.policy.state_dict().values(), run.ref_policy.state_dict().values(),
                    strict=True)
        same = all(torch.equal(a, b) for a, b in pairs)
        events.append(("start", run.iteration, same, len(run.sft_losses)))

    prep.run(lambda n: events.append(n), on_start=on_start)
    assert events[0] == ("start", 0, True, TINY.model.sft_steps)
    assert events[1:] == list(range(1, TINY.run.iterations + 1))
