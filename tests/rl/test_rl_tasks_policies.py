"""Tasks (verifiers, exact reference PoS) and policies (sampling, log-probabilities)."""

import numpy as np
import pytest
import torch

from grpo_companion.rl import tasks
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer


def test_bandit_reference_pos_is_exact():
    task = tasks.make_bandit_task(300, 50, n_success=7, p_ref_zero_fraction=0.2, seed=4)
    pos = task.success_prob(torch.log_softmax(task.ref_logits, 1)).numpy()
    np.testing.assert_allclose(pos, task.p_ref, atol=1e-13)
    assert (task.p_ref == 0).sum() > 30 and np.all(pos[task.p_ref == 0] == 0.0)
    assert np.all(task.success.sum(1).numpy() == 7)
    explicit = tasks.make_bandit_task(5, 4, p_ref=[0.0, 0.5, 1.0])
    np.testing.assert_array_equal(explicit.p_ref, [0.0, 0.5, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(explicit.success_prob(torch.log_softmax(explicit.ref_logits, 1)),
                               explicit.p_ref, atol=1e-15)


def test_bandit_reward_is_success_lookup():
    task = tasks.make_bandit_task(4, 6, n_success=2)
    prompts = torch.tensor([2, 0])
    completions = torch.tensor([[0], [1], [5], [3], [4], [2]])
    got = task.reward(prompts, completions, 3)
    expected = [float(task.success[q, int(c)]) for q, c in
                zip([2, 2, 2, 0, 0, 0], completions[:, 0], strict=True)]
    assert got.tolist() == expected


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n_success": 6}, "n_success"), ({"p_ref": [1.2]}, "p_ref"),
    ({"p_ref_zero_fraction": 2.0}, "p_ref_zero_fraction"), ({"p_ref_beta": (0, 1)}, "p_ref_beta"),
])
def test_bandit_rejects_bad_values(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tasks.make_bandit_task(3, 6, **kwargs)


def test_arithmetic_verifier_agrees_with_readable_checker():
    task = tasks.make_arithmetic_task(max_operand=49, n_eval_prompts=256)
    assert len(task.eval_idx) == 256 and not set(task.eval_idx) & set(task.train_idx)
    idx = torch.tensor([0, 57, 1999, 2499])
    prompts = task.prompts(idx)
    a, b = task.operands[57]
    assert prompts[1].tolist() == [tasks.BOS, a // 10, a % 10, tasks.PLUS, b // 10, b % 10,
                                   tasks.EQUALS]
    g = torch.Generator().manual_seed(0)
    rows = []
    for q in idx.tolist():
        s = int(task.operands[q].sum())
        right = [int(c) for c in str(s)] + [tasks.EOS]
        candidates = [right, [0] + right, right[:-1], [int(c) for c in str(s + 1)] + [tasks.EOS]]
        candidates += [torch.randint(0, tasks.VOCAB_SIZE, (4,), generator=g).tolist()]
        rows.append([(c + [tasks.PAD] * 4)[: task.max_new_tokens] for c in candidates])
    completions = torch.tensor([c for group in rows for c in group])
    mask = torch.ones_like(completions, dtype=torch.bool)
    got = task.reward(idx, completions, mask, 5).tolist()
    expected = [float(tasks.check_answer(*task.operands[q], c))
                for q, group in zip(idx.tolist(), rows, strict=True) for c in group]
    assert got == expected
    assert sum(expected) >= 4  # the correct answer is always among the candidates


def test_check_answer_examples():
    assert tasks.check_answer(7, 5, [1, 2, tasks.EOS])
    assert tasks.check_answer(0, 0, [0, tasks.EOS, tasks.PAD])
    assert not tasks.check_answer(7, 5, [0, 1, 2, tasks.EOS])  # leading zero
    assert not tasks.check_answer(7, 5, [1, 2])  # no EOS
    assert not tasks.check_answer(7, 5, [1, tasks.PLUS, tasks.EOS])


def test_sft_data_forgets_carries_at_the_stated_rate():
    task = tasks.make_arithmetic_task(max_operand=49, n_eval_prompts=256)
    g = torch.Generator().manual_seed(0)
    tokens, mask = tasks.sft_batch(task, 4000, g, torch.device("cpu"))
    a = tokens[:, 1] * 10 + tokens[:, 2]
    b = tokens[:, 4] * 10 + tokens[:, 5]
    units = (tokens[:, 2] + tokens[:, 5]).numpy()
    correct = np.array([tasks.check_answer(int(x), int(y), t.tolist())
                        for x, y, t in zip(a, b, tokens[:, tasks.PROMPT_LENGTH:], strict=True)])
    assert correct[units < 10].all()
    heavy = units >= 15  # error rate 1 with the default span of 6
    assert heavy.sum() > 100 and not correct[heavy].any()
    mid = units == 12  # error rate 3/6
    assert abs(correct[mid].mean() - 0.5) < 4 * np.sqrt(0.25 / mid.sum())


def test_tabular_sampling_and_logprobs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, generator=g, dtype=torch.float64)
    policy = TabularSoftmaxPolicy(logits)
    prompts = torch.tensor([0, 2])
    completions, mask = policy.sample(prompts, 20000, generator=g)
    assert completions.shape == (40000, 1) and mask.all()
    probs = torch.softmax(logits, 1)
    for row, q in enumerate(prompts.tolist()):
        freq = torch.bincount(completions[row * 20000:(row + 1) * 20000, 0], minlength=4) / 20000
        se = torch.sqrt(probs[q] * (1 - probs[q]) / 20000)
        assert torch.all((freq - probs[q]).abs() < 4 * se)
    logp = policy.token_logprobs(prompts, completions[:8], 4)
    expected = torch.log(probs[[0] * 4 + [2] * 4, completions[:8, 0]])
    np.testing.assert_allclose(logp[:, 0].detach().numpy(), expected.numpy(), rtol=1e-12)


def _tiny_model():
    torch.manual_seed(0)
    return TinyCausalTransformer(tasks.VOCAB_SIZE, 11, d_model=16, n_layers=2, n_heads=2,
                                 eos_id=tasks.EOS, pad_id=tasks.PAD).double()


def test_transformer_logprobs_match_stepwise_computation():
    model = _tiny_model()
    task = tasks.make_arithmetic_task(max_operand=9, n_eval_prompts=10)
    prompts = task.prompts(torch.tensor([3, 17]))
    g = torch.Generator().manual_seed(1)
    completions, mask = model.sample(prompts, 3, max_new_tokens=3, temperature=0.7, generator=g)
    got = model.token_logprobs(prompts, completions, 3, temperature=0.7)
    for row in range(6):
        seq = prompts[row // 3].tolist()
        for t in range(3):
            logits = model(torch.tensor([seq]))[0, -1] / 0.7
            expected = torch.log_softmax(logits, 0)[completions[row, t]]
            assert abs(float((got[row, t] - expected).detach())) < 1e-10
            seq.append(int(completions[row, t]))
    # Mask: True up to and including the first EOS, PAD afterwards.
    for row in range(6):
        toks = completions[row].tolist()
        end = toks.index(tasks.EOS) + 1 if tasks.EOS in toks else 3
        assert mask[row].tolist() == [True] * end + [False] * (3 - end)
        assert all(t == tasks.PAD for t in toks[end:])


def test_transformer_is_causal():
    model = _tiny_model()
    x = torch.randint(0, tasks.VOCAB_SIZE, (2, 9))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % tasks.VOCAB_SIZE
    torch.testing.assert_close(model(x)[:, :6], model(y)[:, :6])


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf")])
def test_bad_temperature(temperature):
    policy = TabularSoftmaxPolicy(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        policy.sample(torch.tensor([0]), 2, temperature=temperature)


@pytest.mark.slow
def test_pretrained_reference_spreads_over_held_out_prompts():
    from grpo_companion.rl.trainer import TrainConfig, train

    config = TrainConfig.flat(task="sequence", iterations=1, sft_steps=400, mu=1, progress=False,
                              eval_samples=50, n_eval_prompts=256, lr=1e-12)
    result = train(config)
    p_ref = result.p_ref
    assert len(p_ref) >= 200
    assert (p_ref <= 0.1).mean() > 0.05 and (p_ref >= 0.9).mean() > 0.2
    assert ((p_ref > 0.2) & (p_ref < 0.8)).mean() > 0.1
    task = tasks.make_arithmetic_task()
    target = np.where(task.operands[task.eval_idx] % 10 @ [1, 1] >= 10,
                      1 - task.error_rate(task.eval_idx), 1.0)
    assert np.corrcoef(p_ref, target)[0, 1] > 0.7
