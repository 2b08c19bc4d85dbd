"""Where the time of the sequence task goes; what evaluation and sampling cost. Prints JSON.

Measured on the sequence task's default sizes (width 64, 2 layers, 64 prompts
x G = 16 per iteration, mu = 1, beta = 0.1, 256 held-out prompts x 50
samples), on one thread, with a randomly initialised policy (``sft_steps=0``:
the costs depend on the shapes, not on the weights).

- ``sampling``: one iteration's groups (64 x 16) and one evaluation's samples
  (256 x 50) drawn by :meth:`TinyCausalTransformer.sample` (each prompt once,
  then a KV cache) against the sampler it replaced, written out here (one full
  forward pass of every row's whole sequence per new token); the two
  alternate, and ``same_tokens`` says whether they drew the same tokens from
  the same seed. ``training_step_s`` is the rest of a training iteration
  (log-probability passes, backward, optimiser step), for comparison.
- ``evaluation``: a run of ``--iterations`` iterations with ``eval_every=1``;
  the seconds of a training iteration (without its evaluation) and of one
  evaluation, their ratio, the default ``eval_every`` of the sequence task and
  the share of evaluation it leaves: ``eval_over_training`` (evaluation time /
  training time) and ``eval_share_of_run`` (evaluation / everything) in the
  steady state (one evaluation per ``eval_every`` iterations), and both as
  measured in a default-length run (``iterations`` = 20; iteration 0 and the
  last are always evaluated, which a run of 20 cannot amortise).

Medians over ``--repeats``; other jobs on the machine shift every number, the
ratios less.

Usage: ``python benchmarks/bench_trainer.py [--repeats R] [--iterations N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from grpo_companion.rl import trainer as tr
from grpo_companion.rl.grpo_tasks import SequenceGRPO
from grpo_companion.rl.policies import TinyCausalTransformer
from grpo_companion.rl.run_state import RunState


def _full_forward_sample(model: TinyCausalTransformer, prompts: torch.Tensor, group: int,
                         new_tokens: int, generator: torch.Generator) -> torch.Tensor:
    """The sampler before the KV cache: every row's whole sequence again for each token."""
    sequence = prompts.repeat_interleave(group, dim=0)
    done = torch.zeros(len(sequence), dtype=torch.bool)
    drawn_all = []
    with torch.no_grad():
        for _ in range(new_tokens):
            probs = model(sequence)[:, -1].softmax(-1)
            drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            drawn = torch.where(done, torch.full_like(drawn, model.pad_id), drawn)
            done = done | (drawn == model.eos_id)
            drawn_all.append(drawn)
            sequence = torch.cat([sequence, drawn.unsqueeze(1)], dim=1)
    return torch.stack(drawn_all, dim=1)


def _seconds(function: Any) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def sampling(repeats: int) -> dict[str, Any]:
    config = tr.TrainConfig.flat(task="sequence", sft_steps=0, progress=False, device="cpu")
    run = RunState(config, torch.device("cpu"))
    model, task = run.policy, run.task
    out: dict[str, Any] = {}
    new = task.max_new_tokens
    for label, pool, count, group in (("iteration_64x16", task.train_idx, 64, 16),
                                      ("evaluation_256x50", task.eval_idx, 256, 50)):
        prompts = task.prompts(torch.as_tensor(pool[:count]))
        cached, full = [], []
        for _ in range(repeats):  # alternating
            g = torch.Generator().manual_seed(5)
            cached.append(_seconds(lambda p=prompts, g=g, grp=group: model.sample(
                p, grp, max_new_tokens=new, generator=g)))
            g = torch.Generator().manual_seed(5)
            full.append(_seconds(lambda p=prompts, g=g, grp=group: _full_forward_sample(
                model, p, grp, new, g)))
        a = model.sample(prompts, group, max_new_tokens=new,
                         generator=torch.Generator().manual_seed(5))[0]
        b = _full_forward_sample(model, prompts, group, new, torch.Generator().manual_seed(5))
        out[label] = {"kv_cache_s": statistics.median(cached),
                      "full_forward_s": statistics.median(full),
                      "speedup": statistics.median(full) / statistics.median(cached),
                      "same_tokens": bool(torch.equal(a, b)),
                      "rows_differing": int((a != b).any(1).sum())}
    return out


def _timed_run(config: tr.TrainConfig) -> dict[str, float]:
    """Seconds of training (per iteration, evaluation excluded) and per evaluation."""
    spent = {"evaluation": 0.0, "evaluations": 0, "sampling": 0.0}
    evaluate, sample = tr._evaluate, SequenceGRPO.sample

    def timed_evaluate(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return evaluate(*args)
        finally:
            spent["evaluation"] += time.perf_counter() - start
            spent["evaluations"] += 1

    def timed_sample(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return sample(*args)
        finally:
            spent["sampling"] += time.perf_counter() - start

    stamps: list[float] = []
    tr._evaluate = timed_evaluate  # the training loop's evaluation of the tracked prompts
    SequenceGRPO.sample = timed_sample  # line 6 of Algorithm 1: the groups of pi_old
    try:
        start = time.perf_counter()
        result = tr.train(config, callback=lambda n: stamps.append(time.perf_counter()))
    finally:
        tr._evaluate, SequenceGRPO.sample = evaluate, sample
    # the loop: from just before iteration 1 (after pre-training and the evaluation of pi_ref)
    first_eval = spent["evaluation"] / spent["evaluations"]
    loop = stamps[-1] - start
    training = loop - spent["evaluation"]
    return {"training_per_iteration_s": training / config.run.iterations,
            "sampling_per_iteration_s": spent["sampling"] / config.run.iterations,
            "evaluation_s": first_eval, "evaluations": spent["evaluations"],
            "eval_over_training": spent["evaluation"] / training,
            "eval_share_of_run": spent["evaluation"] / loop,
            "rows": len(result.eval_iterations)}


def evaluation(repeats: int, iterations: int) -> dict[str, Any]:
    base = tr.TrainConfig.flat(task="sequence", sft_steps=0, progress=False, device="cpu")
    every_runs, default_runs = [], []
    for _ in range(repeats):  # alternating
        every_runs.append(_timed_run(base.replace(iterations=iterations,
                                                  eval_every=1)))
        default_runs.append(_timed_run(base))
    median = {k: statistics.median(r[k] for r in every_runs) for k in every_runs[0]}
    train_s, eval_s = median["training_per_iteration_s"], median["evaluation_s"]
    every = base.evaluation_interval
    return {
        "training_iteration_s": train_s,
        "of_which_sampling_s": median["sampling_per_iteration_s"],
        "training_step_s": train_s - median["sampling_per_iteration_s"],
        "evaluation_s": eval_s,
        "evaluation_over_iteration": eval_s / train_s,
        "default_eval_every": every,
        "steady_state": {"eval_over_training": eval_s / (every * train_s),
                         "eval_share_of_run": eval_s / (every * train_s + eval_s)},
        "default_run": {
            "iterations": base.run.iterations, "evaluated_iterations": list(base.eval_iterations),
            "eval_over_training": statistics.median(r["eval_over_training"]
                                                    for r in default_runs),
            "eval_share_of_run": statistics.median(r["eval_share_of_run"]
                                                   for r in default_runs)},
        "every_iteration_run": {"iterations": iterations,
                                "eval_share_of_run": median["eval_share_of_run"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6,
                        help="iterations of the run that evaluates every iteration")
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples = sampling(max(args.repeats, 3))
    evals = evaluation(args.repeats, args.iterations)
    samples["training_step_s"] = evals["training_step_s"]
    print(json.dumps({"threads": 1, "torch": torch.__version__, "sampling": samples,
                      "evaluation": evals}, indent=2))


if __name__ == "__main__":
    main()
