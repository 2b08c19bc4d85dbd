"""Several seeds of chapter 8's long run: batched, one after another, or in worker processes.

Prints one JSON object. Each mode trains the same seeds of the same configuration
(default: the chapter's, with fewer iterations) and returns the same ``LongRun`` records:

- ``batched``: :func:`grpo_companion.rl.seed_batch.run_seeds_batched`, one batch in this
  process on one torch thread;
- ``batched_threads_2``: the same batch, its GRPO iterations on two threads;
- ``batched_workers_2``: two half batches in two spawned processes (one thread each);
- ``sequential``: ``run_seeds(..., workers=1)``, the seeds one after another on one thread
  (the reference of the ratios);
- ``workers_2``: ``run_seeds(..., workers=2)``, one seed per process at a time.

Per mode: the wall time, seeds per second, GRPO iterations per second (seeds times
iterations over the wall time), the ratio of its speed to ``sequential``'s, the part of
the wall time spent in the GRPO iterations and their recording (``grpo_seconds``: the
runs' ``train_seconds + record_seconds``, divided by the number of processes that ran in
parallel), the rest (pre-training, set-up, process start), and an estimate of the wall
time at ``--estimate`` iterations (the rest plus ``grpo_seconds`` scaled to that many
iterations). The 1-minute load average before and after tells how busy the machine was
with other work (it slows the parallel modes most). ``agreement_with_sequential`` compares
each mode with ``sequential``, seed by seed: the first iteration at which a group's
successes differ (a sampled token drawn differently because of rounding; from there the
seed follows another sample path of the same process), and the largest difference of the
exact success logits recorded before it.

Usage: ``python benchmarks/bench_seeds.py [--iterations 20] [--seeds 5] [--modes ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from grpo_companion.rl.long_run import CHAPTER8_CONFIG, LongRun, run_seeds
from grpo_companion.rl.seed_batch import run_seeds_batched

MODES = {
    "batched": (lambda c, s, r: run_seeds_batched(c, s, record_every=r), 1),
    "batched_threads_2": (lambda c, s, r: run_seeds_batched(c, s, record_every=r, threads=2),
                          1),
    "batched_workers_2": (lambda c, s, r: run_seeds_batched(c, s, record_every=r, workers=2),
                          2),
    "sequential": (lambda c, s, r: run_seeds(c, s, record_every=r, workers=1), 1),
    "workers_2": (lambda c, s, r: run_seeds(c, s, record_every=r, workers=2), 2),
}


def _first_difference(run: LongRun, reference: LongRun) -> int | None:
    """The first iteration whose groups' successes differ (a sampled token flipped), or None."""
    differ = ~np.all((run.group_successes == reference.group_successes)
                     | (np.isnan(run.group_successes) & np.isnan(reference.group_successes)),
                     axis=1)
    return int(np.argmax(differ)) + 1 if differ.any() else None


def _agreement(runs: list[LongRun], reference: list[LongRun]) -> dict[str, object]:
    """How far each seed's run is from the reference's, and where their samples part."""
    first = [_first_difference(a, b) for a, b in zip(runs, reference, strict=True)]
    gaps = []
    for a, b, n in zip(runs, reference, first, strict=True):
        # the exact logits recorded before any sample differed (rounding only)
        rows = a.steps < n if n is not None else np.ones(len(a.steps), dtype=bool)
        gaps.append(float(np.nanmax(np.abs(a.logit_trained[rows] - b.logit_trained[rows]))))
    return {"first_iteration_with_other_samples": first,
            "max_logit_difference_before_it": gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20, help="GRPO iterations per seed")
    parser.add_argument("--seeds", type=int, default=5, help="number of seeds (0, 1, ...)")
    parser.add_argument("--sft-steps", type=int, default=CHAPTER8_CONFIG.model.sft_steps,
                        help="pre-training steps per seed")
    parser.add_argument("--record-every", type=int, default=10)
    parser.add_argument("--estimate", type=int, nargs="*", default=[120],
                        help="iteration counts to estimate the wall time of")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    args = parser.parse_args()
    config = CHAPTER8_CONFIG.replace(iterations=args.iterations, sft_steps=args.sft_steps)
    seeds = list(range(args.seeds))
    torch.set_num_threads(1)
    report: dict[str, object] = {
        "config": {k: config.to_dict()[k] for k in (
            "iterations", "sft_steps", "d_model", "n_layers", "group_size",
            "prompts_per_iteration", "mu", "n_eval_prompts")},
        "seeds": len(seeds), "cpu_count": os.cpu_count(),
        # other processes on the machine slow every mode, the parallel ones most
        "load_average_before": os.getloadavg()[0],
    }
    results: dict[str, list[LongRun]] = {}
    figures: dict[str, dict[str, float]] = {}
    for mode in args.modes:
        function, parallel = MODES[mode]
        started = time.perf_counter()
        results[mode] = function(config, seeds, args.record_every)
        wall = time.perf_counter() - started
        grpo = sum(r.train_seconds + r.record_seconds for r in results[mode]) / parallel
        rest = max(wall - grpo, 0.0)
        figures[mode] = {
            "seconds": wall, "seeds_per_s": len(seeds) / wall,
            "iterations_per_s": len(seeds) * args.iterations / wall,
            "grpo_seconds": grpo, "other_seconds": rest,
            "grpo_seconds_per_iteration": grpo / args.iterations,
            **{f"estimated_seconds_at_{m}_iterations": rest + grpo * m / args.iterations
               for m in args.estimate},
        }
    if "sequential" in figures:
        base = figures["sequential"]["seconds"]
        for numbers in figures.values():
            numbers["speed_ratio_vs_sequential"] = base / numbers["seconds"]
        report["agreement_with_sequential"] = {
            mode: _agreement(runs, results["sequential"]) for mode, runs in results.items()
            if mode != "sequential"}
    report["load_average_after"] = os.getloadavg()[0]
    report["modes"] = figures
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
