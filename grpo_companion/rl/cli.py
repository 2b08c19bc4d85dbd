"""``python -m grpo_companion train``: toy GRPO runs from the command line.

The lead CLI calls :func:`add_train_arguments` and :func:`run_train`;
``python -m grpo_companion.rl.cli`` runs the same command on its own.
Everything is validated before the output folder is created; a bad option
or value exits with status 2 and an argparse-style message.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from grpo_companion.rl import losses
from grpo_companion.rl.trainer import (
    KL_CHOICES,
    OPTIMIZERS,
    TASKS,
    TrainConfig,
    TrainingFault,
    prepare_run,
)

_DEFAULTS = TrainConfig()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def _clip(text: str) -> float | None:
    if text.lower() in ("none", "inf"):
        return None
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be 'none' or a number in [0, 1], got {text!r}")
    return value


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else _positive_int(text)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option of :class:`~grpo_companion.rl.trainer.TrainConfig` to ``parser``."""
    d = _DEFAULTS
    run = parser.add_argument_group("run")
    run.add_argument("--task", choices=TASKS, default=d.task,
                     help="bandit (tabular softmax) or sequence (tiny transformer, addition)")
    run.add_argument("--out", type=Path, required=True,
                     help="output folder (must be new or empty unless --resume)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run checkpointed in --out (same options)")
    run.add_argument("--exact", action="store_true",
                     help="bandit only: exact expectations and inner solves (the paper's "
                          "iteration); ignores the sampling options")
    run.add_argument("--iterations", type=_positive_int, default=d.iterations,
                     help="outer GRPO iterations M")
    run.add_argument("--seed", type=_nonnegative_int, default=d.seed)
    run.add_argument("--device", default=d.device, help="auto, cpu or cuda[:N]")
    run.add_argument("--dtype", choices=("float32", "float64"), default=d.dtype,
                     help="bandit sampled-mode precision (exact mode is always float64)")
    run.add_argument("--checkpoint-every", type=_positive_int, default=d.checkpoint_every)
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    obj = parser.add_argument_group("objective")
    obj.add_argument("--beta", type=float, default=d.beta, help="KL weight (> 0)")
    obj.add_argument("--alpha", type=float, default=d.alpha,
                     help="reference share of the KL anchor: 1 GRPO, 0 mirror, else two-KL")
    obj.add_argument("--ref-reset-every", type=_optional_int, default=d.ref_reset_every,
                     help="reset pi_ref <- pi every this many iterations (DeepSeekMath)")
    obj.add_argument("--normalization", choices=losses.NORMALIZATIONS, default=d.normalization)
    obj.add_argument("--eps", type=float, default=d.eps, help="smoothing constant (>= 0)")
    obj.add_argument("--eps-placement", choices=losses.EPS_PLACEMENTS, default=d.eps_placement,
                     help="sqrt: (r-mean)/sqrt(var+eps) (paper); std: (r-mean)/(std+eps) (TRL)")
    obj.add_argument("--ddof", type=int, choices=(0, 1), default=d.ddof,
                     help="group variance: 0 population (paper), 1 Bessel (TRL)")
    obj.add_argument("--exact-group-size", type=_optional_int, default=d.exact_group_size,
                     help="exact mode: expected weights of a group of this size (none: paper)")

    upd = parser.add_argument_group("sampled updates")
    upd.add_argument("--group-size", type=_positive_int, default=d.group_size, help="G")
    upd.add_argument("--mu", type=_positive_int, default=d.mu,
                     help="optimiser steps per outer iteration")
    upd.add_argument("--clip-eps", type=_clip, default=None,
                     help="PPO clip range (low side), or 'none'; default: "
                          f"{d.clip_eps_low} in sampled mode, none with --exact")
    upd.add_argument("--clip-eps-high", type=_clip, default=None,
                     help="upper clip range (DAPO clip-higher); default: --clip-eps")
    upd.add_argument("--kl", choices=KL_CHOICES, default=d.kl,
                     help="KL estimator in the loss (exact: bandit only)")
    upd.add_argument("--loss-type", choices=losses.LOSS_TYPES, default=d.loss_type)
    upd.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    upd.add_argument("--lr", type=float, default=None,
                     help="learning rate (default: 0.1 bandit, 1e-3 sequence)")
    upd.add_argument("--temperature", type=float, default=d.temperature)
    upd.add_argument("--prompts-per-iteration", type=_optional_int, default=None,
                     help="prompts per iteration (default: all bandit prompts, 64 sequence)")

    ban = parser.add_argument_group("bandit task")
    ban.add_argument("--n-prompts", type=_positive_int, default=d.n_prompts)
    ban.add_argument("--n-outputs", type=int, default=d.n_outputs, help="K (>= 2)")
    ban.add_argument("--n-success", type=_optional_int, default=d.n_success,
                     help="size of each success set (default: K // 10, at least 1)")
    ban.add_argument("--p-ref", type=float, nargs="+", default=None,
                     help="reference PoS values, cycled over prompts (default: Beta draws)")
    ban.add_argument("--p-ref-beta", type=float, nargs=2, default=list(d.p_ref_beta),
                     metavar=("A", "B"), help="Beta(A, B) for the reference PoS")
    ban.add_argument("--p-ref-zero-fraction", type=float, default=d.p_ref_zero_fraction,
                     help="fraction of prompts with p_ref = 0")

    seq = parser.add_argument_group("sequence task")
    seq.add_argument("--max-operand", type=_positive_int, default=d.max_operand)
    seq.add_argument("--n-eval-prompts", type=_positive_int, default=d.n_eval_prompts,
                     help="held-out prompts whose PoS is tracked")
    seq.add_argument("--eval-samples", type=_positive_int, default=d.eval_samples,
                     help="samples per held-out prompt for the PoS estimate")
    seq.add_argument("--sft-steps", type=_nonnegative_int, default=d.sft_steps,
                     help="supervised pre-training steps of the reference")
    seq.add_argument("--d-model", type=_positive_int, default=d.d_model)
    seq.add_argument("--n-layers", type=_positive_int, default=d.n_layers)
    seq.add_argument("--n-heads", type=_positive_int, default=d.n_heads)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Build (and so validate) the configuration from parsed arguments."""
    clip_low = args.clip_eps
    if clip_low is None and args.clip_eps_high is None and not args.exact:
        clip_low = _DEFAULTS.clip_eps_low
    if clip_low is None and args.clip_eps_high is not None:
        raise ValueError("--clip-eps-high needs --clip-eps (clipping is off)")
    values = {
        "task": args.task, "exact": args.exact, "iterations": args.iterations,
        "seed": args.seed, "device": args.device, "dtype": args.dtype,
        "checkpoint_every": args.checkpoint_every, "progress": not args.no_progress,
        "beta": args.beta, "alpha": args.alpha, "ref_reset_every": args.ref_reset_every,
        "normalization": args.normalization, "eps": args.eps,
        "eps_placement": args.eps_placement, "ddof": args.ddof,
        "exact_group_size": args.exact_group_size, "group_size": args.group_size,
        "mu": args.mu, "clip_eps_low": clip_low, "clip_eps_high": args.clip_eps_high,
        "kl": args.kl, "loss_type": args.loss_type, "optimizer": args.optimizer,
        "lr": args.lr, "temperature": args.temperature,
        "prompts_per_iteration": args.prompts_per_iteration, "n_prompts": args.n_prompts,
        "n_outputs": args.n_outputs, "n_success": args.n_success,
        "p_ref": None if args.p_ref is None else tuple(args.p_ref),
        "p_ref_beta": tuple(args.p_ref_beta), "p_ref_zero_fraction": args.p_ref_zero_fraction,
        "max_operand": args.max_operand, "n_eval_prompts": args.n_eval_prompts,
        "eval_samples": args.eval_samples, "sft_steps": args.sft_steps,
        "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
    }
    for name in ("beta", "alpha", "eps", "temperature", "lr", "p_ref_zero_fraction"):
        if values[name] is not None and math.isnan(values[name]):
            raise ValueError(f"--{name.replace('_', '-')} must be a number, got nan")
    try:
        return TrainConfig(**values)
    except ValueError as err:  # name the option as typed: --group-size, not group_size
        text = str(err)
        options = {"clip_eps_low": "--clip-eps", "progress": "--no-progress"}
        for name in sorted(values, key=len, reverse=True):
            if text.startswith(f"{name} "):
                option = options.get(name, f"--{name.replace('_', '-')}")
                text = f"{option}{text[len(name):]}"
                break
        raise ValueError(text) from None


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so that run.json records the stop."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def stop(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _error(message: str) -> None:
    text = " ".join(str(message).split())  # one line
    print(f"python -m grpo_companion train: error: {text}", file=sys.stderr)


def run_train(args: argparse.Namespace) -> int:
    """Validate everything, then train; returns the process exit status.

    - 2, nothing written: invalid options, an output folder that cannot be
      used, or (``--resume``) a checkpoint that is unreadable or of another
      configuration.
    - 1: the run failed midway (it diverged, a solve failed, a file could not
      be written); ``run.json`` says ``"failed"`` with the message.
    - 130 (Ctrl-C) or 143 (SIGTERM): interrupted; ``run.json`` says
      ``"interrupted"`` and ``--resume`` continues from the last checkpoint.
    - 0 after a complete run.

    Each error is one line on stderr, without a traceback. Files are written
    atomically, so a stopped run never leaves a half-written one.
    """
    try:
        config = config_from_args(args)
        prepared = prepare_run(config, out_dir=args.out, resume=args.resume)
    except ValueError as err:
        _error(str(err))
        return 2
    except OSError as err:  # a file of the folder that cannot be read
        _error(f"cannot use {err.filename or args.out!r}: {err.strerror or err}")
        return 2
    except KeyboardInterrupt:
        _error("interrupted before the run started; nothing was written")
        return 130
    out = prepared.out
    try:
        with _sigterm_as_interrupt():
            result = prepared.run()
    except KeyboardInterrupt as stop:
        _error(f"{'terminated' if isinstance(stop, _Terminated) else 'interrupted'}; run.json "
               f"in {out} says so, and --resume continues from the last checkpoint")
        return 143 if isinstance(stop, _Terminated) else 130
    except TrainingFault as err:
        _error(f"{err} (recorded in {out / 'run.json' if out else 'no folder'})")
        return 1
    except OSError as err:  # e.g. the disk filled up or became read-only during the run
        where = f" {err.filename!r}" if err.filename else ""
        _error(f"cannot write{where}: {err.strerror or err}; the run stopped, --resume "
               "continues from the last checkpoint")
        return 1
    final = result.success_prob[-1]
    print(f"done: {config.iterations} iterations on {result.device}; mean PoS "
          f"{result.success_prob[0].mean():.4f} -> {final.mean():.4f}; results in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m grpo_companion.rl.cli``."""
    parser = argparse.ArgumentParser(
        prog="python -m grpo_companion.rl.cli", description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


__all__ = ["add_train_arguments", "config_from_args", "main", "run_train"]

if __name__ == "__main__":
    raise SystemExit(main())
