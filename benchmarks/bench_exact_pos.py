"""What an exact success probability costs on the addition task, against its peers. Prints JSON.

Chapter 8 measures every prompt's success probability exactly, by enumerating every output
(``TinyCausalTransformer.output_log_probs``: the tree of prefixes expanded on the attention
cache). Side by side, on the same prompts and the same randomly initialised transformer
(chapter 8's width 32, 2 layers; one thread):

- ``tree_s``: the enumeration;
- ``full_forward_s``: the same probabilities from one full forward pass of every
  (prompt, output) pair, the direct way; ``speedup_vs_full_forward`` is its time over the tree's,
  and ``max_abs_diff`` the largest difference of the two log-probabilities (float32 rounding);
- ``sampled_50_s``: the trainer's 50-sample estimate of the same prompts (KV-cache sampling),
  which has a binomial standard error of up to 0.07; ``tree_over_sampled`` is the tree's time over
  it.

Medians over ``--repeats``. Usage: ``python benchmarks/bench_exact_pos.py [--prompts N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from grpo_companion.rl.policies import TinyCausalTransformer
from grpo_companion.rl.tasks import EOS, PAD, VOCAB_SIZE, make_arithmetic_task


def _median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = make_arithmetic_task(n_eval_prompts=args.prompts)
    model = TinyCausalTransformer(VOCAB_SIZE, task.max_len, d_model=32, n_layers=2, n_heads=4,
                                  eos_id=EOS, pad_id=PAD).eval()
    prompts = task.prompts(torch.as_tensor(task.eval_idx))
    steps = task.max_new_tokens

    def tree() -> tuple[torch.Tensor, list[tuple[int, ...]]]:
        return model.output_log_probs(prompts, max_new_tokens=steps)

    log_probs, outputs = tree()
    padded = torch.tensor([list(o) + [PAD] * (steps - len(o)) for o in outputs])
    lengths = torch.tensor([len(o) for o in outputs])
    keep = torch.arange(steps)[None, :] < lengths[:, None]

    def full_forward() -> torch.Tensor:
        with torch.no_grad():
            rows = []
            for p in prompts:
                sequence = torch.cat([p.expand(len(outputs), -1), padded], dim=1)
                logits = model(sequence[:, :-1])[:, prompts.shape[1] - 1:]
                logp = torch.log_softmax(logits.double(), -1).gather(2, padded.unsqueeze(2))
                rows.append((logp.squeeze(2) * keep).sum(1))
            return torch.stack(rows)

    def sampled() -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return model.sample(prompts, 50, max_new_tokens=steps, generator=generator)[0]

    direct = full_forward()
    tree_s = _median_seconds(tree, args.repeats)
    full_s = _median_seconds(full_forward, max(1, args.repeats // 2))
    sampled_s = _median_seconds(sampled, args.repeats)
    print(json.dumps({
        "prompts": args.prompts, "outputs": len(outputs), "tree_s": round(tree_s, 4),
        "full_forward_s": round(full_s, 4), "speedup_vs_full_forward": round(full_s / tree_s, 1),
        "max_abs_diff": float((direct - log_probs).abs().max()),
        "sampled_50_s": round(sampled_s, 4), "tree_over_sampled": round(tree_s / sampled_s, 2),
        "threads": torch.get_num_threads()}, indent=1))


if __name__ == "__main__":
    main()
