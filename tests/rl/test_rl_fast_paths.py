"""What the trainer no longer computes twice gives the same numbers as computing it.

- pi_old's per-token log-probabilities are those of the first loss of the
  iteration (the policy is still pi_old then), not of a separate forward pass
  of a frozen copy; for mu = 1 that is the whole old-policy pass saved.
- The transformer samples with a KV cache and runs each prompt once per group
  (sampling and log-probabilities); the previous full-sequence computations are
  written out here as the reference.
"""

import numpy as np
import pytest
import torch

from grpo_companion.rl import tasks, trainer
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.trainer import TrainConfig, train

SEQUENCE = {"task": "sequence", "max_operand": 19, "n_eval_prompts": 16, "eval_samples": 4,
            "sft_steps": 10, "sft_batch_size": 32, "iterations": 3, "prompts_per_iteration": 8,
            "group_size": 4, "d_model": 16, "n_heads": 2, "progress": False, "eval_every": 1}
BANDIT = {"n_prompts": 16, "n_outputs": 6, "iterations": 4, "group_size": 8, "progress": False}
CASES = {
    "sequence-mu1": {**SEQUENCE, "mu": 1},
    "sequence-mu3-mirror": {**SEQUENCE, "mu": 3, "alpha": 0.5, "kl": "k3_ratio"},
    "bandit-mu1": {**BANDIT, "mu": 1},
    "bandit-mu2-exact-kl": {**BANDIT, "mu": 2, "kl": "exact"},
    "bandit-lbfgs": {**BANDIT, "n_outputs": 2, "n_success": 1, "mu": 1, "kl": "exact",
                     "clip_eps_low": None, "optimizer": "lbfgs", "dtype": "float64"},
}


def _explicit_old_pass(monkeypatch):
    """The previous implementation: pi_old's log-probabilities by its own forward pass."""
    anchors = trainer._fixed_log_probs

    def explicit(run, old, samples):
        out = anchors(run, old, samples)
        with torch.no_grad():
            out.old = old.token_logprobs(samples.prompts, samples.completions, samples.group,
                                         temperature=run.config.grpo.temperature)
        return out

    monkeypatch.setattr(trainer, "_fixed_log_probs", explicit)


@pytest.mark.parametrize("settings", CASES.values(), ids=CASES.keys())
def test_reused_old_logprobs_match_an_explicit_old_forward_pass(monkeypatch, settings):
    config = TrainConfig.flat(**settings)
    reused = train(config)
    with monkeypatch.context() as patch:
        _explicit_old_pass(patch)
        explicit = train(config)
    for name, values in explicit.metrics.items():
        np.testing.assert_allclose(reused.metrics[name], values, rtol=1e-6, atol=1e-9,
                                   err_msg=name)
    for mine, theirs in zip(reused.iteration_rows, explicit.iteration_rows, strict=True):
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key


@pytest.mark.parametrize(("cls", "settings"), [(TinyCausalTransformer, CASES["sequence-mu1"]),
                                               (TabularSoftmaxPolicy, CASES["bandit-mu1"])],
                         ids=["sequence", "bandit"])
def test_mu_one_runs_no_old_policy_forward_pass(monkeypatch, cls, settings):
    calls: list[object] = []
    per_step: list[list[str]] = []
    original, step = cls.token_logprobs, trainer.grpo_iteration

    def spy(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    def spy_step(run, old):
        calls.clear()
        out = step(run, old)
        per_step.append(["policy" if c is run.policy else "ref" if c is run.ref_policy
                         else "old" for c in calls])
        return out

    monkeypatch.setattr(cls, "token_logprobs", spy)
    monkeypatch.setattr(trainer, "grpo_iteration", spy_step)
    train(TrainConfig.flat(**settings))
    assert len(per_step) == settings["iterations"]
    for names in per_step:  # one pass of the policy (the loss) and one of pi_ref (the KL)
        assert sorted(names) == ["policy", "ref"], names


# ----------------------------------------------------------- transformer paths
def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = TinyCausalTransformer(tasks.VOCAB_SIZE, 10, d_model=32, n_layers=2, n_heads=4,
                                  eos_id=tasks.EOS, pad_id=tasks.PAD)
    return model.to(dtype)


def _prompts(count=24):
    task = tasks.make_arithmetic_task()
    return task, task.prompts(torch.as_tensor(task.train_idx[:count]))


def _full_sequence_sample(model, prompts, group, new_tokens, temperature, generator):
    """The sampler before the KV cache: one forward pass of every whole sequence per token."""
    sequence = prompts.repeat_interleave(group, dim=0)
    done = torch.zeros(len(sequence), dtype=torch.bool)
    out = []
    with torch.no_grad():
        for _ in range(new_tokens):
            probs = (model(sequence)[:, -1] / temperature).softmax(-1)
            drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            drawn = torch.where(done, torch.full_like(drawn, model.pad_id), drawn)
            done = done | (drawn == model.eos_id)
            out.append(drawn)
            sequence = torch.cat([sequence, drawn.unsqueeze(1)], dim=1)
    return torch.stack(out, dim=1)


def _full_sequence_logprobs(model, prompts, completions, group, temperature):
    sequence = torch.cat([prompts.repeat_interleave(group, dim=0), completions], dim=1)
    logits = model(sequence[:, :-1])[:, prompts.shape[1] - 1:] / temperature
    return torch.log_softmax(logits, -1).gather(2, completions.unsqueeze(2)).squeeze(2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_kv_cache_sampler_draws_what_full_forward_passes_draw(dtype, temperature):
    model = _model(dtype)
    task, prompts = _prompts()
    new = task.max_new_tokens
    cached, mask = model.sample(prompts, 16, max_new_tokens=new, temperature=temperature,
                                generator=torch.Generator().manual_seed(3))
    full = _full_sequence_sample(model, prompts, 16, new, temperature,
                                 torch.Generator().manual_seed(3))
    differing = int((cached != full).any(1).sum())
    if dtype == torch.float64:  # the distributions agree to ~1e-15: the same draws
        assert differing == 0
    else:  # float32 rounding may move a draw that falls within ~1e-7 of a boundary
        assert differing <= 2, differing
    eos_seen = torch.cumsum((cached == tasks.EOS).long(), 1) - (cached == tasks.EOS).long()
    assert torch.equal(mask, eos_seen == 0)


def test_greedy_decoding_is_identical_with_and_without_the_cache():
    model = _model(torch.float32, seed=4)
    task, prompts = _prompts(64)
    # greedy: the argmax at each step, cached (the sampler's path) and full sequences
    logits, past = model._shared_prompts(prompts, 1)
    sequence, cached = prompts, []
    with torch.no_grad():
        for step in range(task.max_new_tokens):
            if step:
                hidden, past = model._extend(cached[-1].unsqueeze(1), past)
                logits = model.head(hidden[:, -1])
            cached.append(logits.argmax(-1))
            full = model(sequence)[:, -1]
            np.testing.assert_allclose(logits.numpy(), full.numpy(), atol=1e-5)
            assert torch.equal(full.argmax(-1), cached[-1])
            sequence = torch.cat([sequence, cached[-1].unsqueeze(1)], 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_shared_prompt_logprobs_and_gradients_match_full_sequences(dtype):
    model = _model(dtype)
    task, prompts = _prompts(12)
    completions, _ = model.sample(prompts, 5, max_new_tokens=task.max_new_tokens,
                                  temperature=0.8, generator=torch.Generator().manual_seed(1))
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4,
                                                                         "atol": 1e-5}
    weights = torch.rand(completions.shape, generator=torch.Generator().manual_seed(2),
                         dtype=dtype)
    grads = []
    for function in (model.token_logprobs, lambda *a, **k: _full_sequence_logprobs(
            model, *a, **k)):
        model.zero_grad()
        logp = function(prompts, completions, 5, temperature=0.8)
        (logp * weights).sum().backward()
        grads.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    np.testing.assert_allclose(grads[0][0].numpy(), grads[1][0].numpy(), **tol)
    for mine, theirs in zip(grads[0][1], grads[1][1], strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), **tol)


def test_sampler_logprobs_are_those_of_the_drawn_tokens():
    model = _model(torch.float64)
    task, prompts = _prompts(8)
    completions, mask, logp = model.sample_with_logprobs(
        prompts, 6, max_new_tokens=task.max_new_tokens, temperature=0.7,
        generator=torch.Generator().manual_seed(0))
    again, _ = model.sample(prompts, 6, max_new_tokens=task.max_new_tokens, temperature=0.7,
                            generator=torch.Generator().manual_seed(0))
    assert torch.equal(completions, again)
    expected = model.token_logprobs(prompts, completions, 6, temperature=0.7).detach()
    np.testing.assert_allclose((logp * mask).numpy(), (expected * mask).numpy(), rtol=1e-10,
                               atol=1e-12)
