"""Wall time of chapter 8's long runs for several normalisations (the beyond-the-paper runs).

Trains :func:`grpo_companion.rl.seed_batch.run_seeds_batched` with chapter 8's model and
GRPO settings (d_model 32, 2 layers, 4 heads, 600 SFT steps, operands up to 49,
temperature 1, Adam at lr 2e-4, plain k3, ``loss_type="dr_grpo"``, clip 0.2, mu 10,
G = 16, beta 0.1 with the multipliers 1, 3, 10, 30), for four normalisations: the built-in
``mean_std`` (GRPO's whitening) and three registered here, whitening with

- ``positive_only``: the failures' weight set to 0 (``w- = 0``);
- ``negative_only``: the successes' weight set to 0 (``w+ = 0``);
- ``positive_tenth``: the successes' weight times 0.1.

Their gains are module-level functions of this script, so that the spawned workers find
them (spawn imports the script as ``__mp_main__``; the registration itself is under the
``__main__`` guard, and ``run_seeds_batched`` registers them again in each worker).

Settings (``--setting``, several allowed):

- ``a``: 2 seeds, 30 iterations, 32 trained prompts, 64 held-out, ``workers=2``;
- ``b``: 3 seeds, 60 iterations, the same prompts, ``workers=2``.

``--normalizations`` picks some of the four, in the order given. Prints one line per
normalisation and setting (seconds, and the seconds of the GRPO
iterations and their recording as the runs report them), then each setting's total.
Usage: ``python benchmarks/bench_beyond_runs.py [--setting a] [--setting b]``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

from grpo_companion import theory
from grpo_companion.rl.long_run import CHAPTER8_CONFIG
from grpo_companion.rl.seed_batch import run_seeds_batched

#: name: (seeds, iterations, trained prompts, held-out prompts, workers)
SETTINGS = {"a": (2, 30, 32, 64, 2), "b": (3, 60, 32, 64, 2)}
RECORD_EVERY = 10


def _scale(succ, fail, n, cal, ops):
    """The whitening's standard deviation (the paper's eq. 4, or TRL's placement of eps)."""
    var = succ * fail if n is None else succ * fail * n / (n - cal.ddof)
    return ops.sqrt(var + cal.eps) if cal.eps_placement == "sqrt" else ops.sqrt(var) + cal.eps


def positive_only_gains(succ, fail, n, cal, ops):
    """Whitening with ``w- = 0``: only the successes are pushed."""
    return fail / _scale(succ, fail, n, cal, ops), 0 * succ


def negative_only_gains(succ, fail, n, cal, ops):
    """Whitening with ``w+ = 0``: only the failures are pushed down."""
    return 0 * fail, succ / _scale(succ, fail, n, cal, ops)


def positive_tenth_gains(succ, fail, n, cal, ops):
    """Whitening with the successes' weight times 0.1."""
    scale = _scale(succ, fail, n, cal, ops)
    return 0.1 * fail / scale, succ / scale


CUSTOM = {"positive_only": positive_only_gains, "negative_only": negative_only_gains,
          "positive_tenth": positive_tenth_gains}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS),
                        help="which setting(s) to time (default: a)")
    parser.add_argument("--normalizations", nargs="+", choices=("mean_std", *CUSTOM),
                        default=("mean_std", *CUSTOM), help="which ones, in this order")
    args = parser.parse_args()
    for name, gains in CUSTOM.items():
        theory.register_normalization(name, gains, summary=gains.__doc__.split("\n")[0],
                                      uses_eps=True, uses_ddof=True, replace=True)
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.2f}")
    for setting in args.setting or ["a"]:
        n_seeds, iterations, trained, held, workers = SETTINGS[setting]
        config = CHAPTER8_CONFIG.replace(iterations=iterations, grpo_prompts=trained,
                                         prompts_per_iteration=trained, n_eval_prompts=held)
        total = 0.0
        for normalization in args.normalizations:
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's spawn start-up chatter
                runs = run_seeds_batched(config.replace(normalization=normalization),
                                         list(range(n_seeds)), record_every=RECORD_EVERY,
                                         workers=workers)
            wall = time.perf_counter() - started
            total += wall
            grpo = sum(r.train_seconds + r.record_seconds for r in runs) / workers
            held_pos = np.mean([1 / (1 + np.exp(-r.logit_held[-1])) for r in runs])
            print(f"setting {setting} ({n_seeds} seeds x {iterations} iterations, {trained} "
                  f"trained / {held} held-out prompts, workers={workers}) {normalization:>15}: "
                  f"{wall:6.1f} s (GRPO iterations and recording about {grpo:5.1f} s per "
                  f"worker; held-out mean PoS at the end {held_pos:.3f})", flush=True)
        print(f"setting {setting}: {total:.1f} s for {len(args.normalizations)} "
              f"normalisations x {n_seeds} seeds; "
              f"load average now {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
