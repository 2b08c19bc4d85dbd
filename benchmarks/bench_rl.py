"""Benchmarks of grpo_companion.rl; prints one JSON object.

- ``bandit``: sampled GRPO iterations per second on a 1024-prompt, K = 1000
  bandit (G = 16, mu = 10), the batched trainer versus a per-prompt Python loop
  doing the same work (sampling, advantages, mu Adam steps, exact KL) one
  prompt at a time.
- ``transformer``: tiny-transformer GRPO training and sampling throughput in
  tokens per second, and the achieved fraction of this machine's measured
  fp32 matmul rate during training steps (model FLOPs ~= 6 * params * tokens).
- ``checkpoint``: what checkpointing costs. The default bandit is trained for
  ``iterations`` with a checkpoint after every iteration and with one at the end
  only; reported are both wall times, the checkpoint's size, and the mean
  seconds per iteration over the first and the last tenth of the run with a
  checkpoint every iteration (equal when a checkpoint costs the same whatever
  the length of the history).

Usage: ``python benchmarks/bench_rl.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from grpo_companion.rl import losses
from grpo_companion.rl.policies import TabularSoftmaxPolicy, TinyCausalTransformer
from grpo_companion.rl.tasks import EOS, PAD, VOCAB_SIZE, make_arithmetic_task, make_bandit_task
from grpo_companion.rl.trainer import TrainConfig, resolve_device, train


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandit(iterations: int, loop_prompts: int) -> dict[str, float]:
    n_prompts, n_outputs, group, mu = 1024, 1000, 16, 10
    config = TrainConfig.flat(n_prompts=n_prompts, n_outputs=n_outputs, group_size=group, mu=mu,
                              iterations=iterations, progress=False, kl="exact")
    stamps: list[float] = []
    train(config, callback=lambda n: stamps.append(time.perf_counter()))
    # Steady state: from the end of iteration 1 to the end of the last one (excludes setup).
    batched = (iterations - 1) / (stamps[-1] - stamps[0])

    task = make_bandit_task(n_prompts, n_outputs, seed=0)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for q in range(loop_prompts):
        policy = TabularSoftmaxPolicy(task.ref_logits[q:q + 1].float())
        ref_logp = policy.log_probs().detach()
        optimizer = torch.optim.Adam(policy.parameters(), lr=0.1)
        prompt = torch.tensor([0])
        completions, mask = policy.sample(prompt, group, generator=generator)
        rewards = task.success[q, completions[:, 0]].float().view(1, group)
        adv = losses.group_advantages(rewards, eps=1e-5, eps_placement="sqrt", ddof=0).view(-1)
        prev_logp = policy.token_logprobs(prompt, completions, group).detach()
        prev_logp = policy.log_probs().detach()
        for _ in range(mu):
            logp = policy.token_logprobs(prompt, completions, group)
            loss = losses.grpo_loss(logp, prev_logp, None, adv, mask)
            current = policy.log_probs()
            loss = loss + 0.1 * losses.tabular_kl(current, ref_logp).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            current = policy.log_probs()
            task.success_prob(current)  # the same per-iteration metrics as the trainer
            losses.tabular_kl(current, prev_logp)
    loop_seconds_per_iteration = (time.perf_counter() - start) * n_prompts / loop_prompts
    return {"prompts": n_prompts, "outputs": n_outputs, "group_size": group, "mu": mu,
            "batched_iterations_per_s": batched,
            "loop_iterations_per_s": 1.0 / loop_seconds_per_iteration,
            "loop_prompts_timed": loop_prompts,
            "speedup": batched * loop_seconds_per_iteration}


def matmul_peak(device: torch.device, size: int = 2048, repeats: int = 10) -> float:
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    torch.matmul(a, b)
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    _sync(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def transformer(device: torch.device, steps: int, d_model: int) -> dict[str, float]:
    task = make_arithmetic_task()
    torch.manual_seed(0)
    model = TinyCausalTransformer(VOCAB_SIZE, task.max_len, d_model=d_model, n_layers=2,
                                  n_heads=4, eos_id=EOS, pad_id=PAD).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch, group = 256, 16
    generator = torch.Generator(device=device).manual_seed(0)
    idx = torch.as_tensor(task.train_idx[:batch], device=device)
    prompts = task.prompts(idx)

    start = time.perf_counter()
    completions, mask = model.sample(prompts, group, max_new_tokens=task.max_new_tokens,
                                     generator=generator)
    _sync(device)
    sample_tokens_per_s = completions.numel() / (time.perf_counter() - start)

    rewards = task.reward(idx, completions, mask, group)
    adv = losses.group_advantages(rewards.view(batch, group)).view(-1)
    with torch.no_grad():
        old = model.token_logprobs(prompts, completions, group)

    def step() -> None:
        logp = model.token_logprobs(prompts, completions, group)
        loss = losses.grpo_loss(logp, old, old, adv, mask.float(), beta=0.04)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    seconds = time.perf_counter() - start
    tokens = steps * completions.shape[0] * (task.max_len - 1)
    flops = 6 * params * tokens / seconds
    peak = matmul_peak(device)
    return {"d_model": d_model, "params": params, "sequences_per_step": completions.shape[0],
            "train_tokens_per_s": tokens / seconds, "sample_tokens_per_s": sample_tokens_per_s,
            "train_flops_per_s": flops, "matmul_peak_flops_per_s": peak,
            "fraction_of_peak": flops / peak}


def checkpoint_cost(iterations: int) -> dict[str, float]:
    report: dict[str, float] = {"iterations": iterations}
    with tempfile.TemporaryDirectory() as folder:
        for every in (1, iterations):
            out = Path(folder) / f"every_{every}"
            config = TrainConfig.flat(iterations=iterations, checkpoint_every=every, progress=False)
            stamps: list[float] = []
            start = time.perf_counter()
            train(config, out_dir=out,
                  callback=lambda n, stamps=stamps: stamps.append(time.perf_counter()))
            report[f"seconds_checkpoint_every_{every}"] = time.perf_counter() - start
            if every == 1:
                tenth = max(2, iterations // 10)
                report["s_per_iteration_first_tenth"] = (stamps[tenth] - stamps[0]) / tenth
                report["s_per_iteration_last_tenth"] = (stamps[-2] - stamps[-2 - tenth]) / tenth
                report["checkpoint_bytes_final"] = (out / "checkpoint.pt").stat().st_size
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    device = resolve_device("auto")
    report = {
        "device": str(device), "torch_threads": torch.get_num_threads(),
        "bandit": bandit(iterations=3 if args.quick else 6,
                         loop_prompts=64 if args.quick else 1024),
        "transformer": transformer(device, steps=2 if args.quick else 5, d_model=128),
        "checkpoint": checkpoint_cost(150 if args.quick else 1500),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
