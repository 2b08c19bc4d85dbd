"""Our GRPO trainer against TRL's ``GRPOTrainer`` on the same tiny task; prints one JSON object.

The task is the addition task of ``grpo_companion.rl.tasks`` (prompts ``^ab+cd=``,
answers in digits then an end token, reward 1 iff the answer is right). Both
trainers get the same settings:

- a GPT-style decoder of about 100k parameters (width 64, 2 layers, 4 heads,
  15 tokens, pre-LayerNorm, GELU, learned positions, no dropout) with random
  weights: ours is ``TinyCausalTransformer``; TRL's is a ``transformers``
  ``GPT2LMHeadModel`` built from a ``GPT2Config`` (no Hub), with a tokenizer
  built locally with ``tokenizers`` (one token per character, the same ids);
- 64 prompts per step, G = 16 completions each (1024 rows), at most 3 new
  tokens, temperature 1, mu = 1, beta = 0 (TRL's default: no reference model),
  clipping 0.2, TRL's advantages (``scale_rewards="group"``: our
  ``--calibration trl``), ``loss_type="dapo"`` (TRL's default), Adam at a
  constant learning rate 1e-3 without weight decay or gradient clipping;
- one CPU thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``).

Each measurement runs in its own process; the two trainers alternate
(ours, TRL, TRL, ours, ...) so that a change in the machine's load falls on
both. A run does ``--warmup`` steps, then ``--steps`` timed steps (the time
from the end of the last warm-up step to the end of the last timed step).
Our evaluation of held-out prompts is outside the timed steps (``eval_every``
is the length of the run), as TRL has none.

Reported per trainer: the median over repeats of steps per second and of
completion tokens per second (tokens up to and including the end token), and
where the time of a step goes (seconds per step, medians): for ours
``sampling``, ``rewards_advantages``, ``reference_logprobs`` (0 with beta = 0),
``policy_forward_loss``, ``backward``, ``optimizer_step`` and ``other``; for
TRL ``sampling`` (``transformers`` generate and decoding), ``rewards``,
``other_generate_and_score`` (tokenising, advantages, bookkeeping),
``policy_forward_loss`` (its ``compute_loss``), ``backward``,
``optimizer_step`` and ``other`` (the rest of ``Trainer``'s step). ``ratio`` is
ours / TRL in steps per second.

Usage: ``python benchmarks/bench_trl.py [--steps N] [--warmup N] [--repeats R]``.
Needs ``trl`` (1.16), ``transformers``, ``tokenizers`` and ``datasets``; nothing
is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WIDTH, LAYERS, HEADS = 64, 2, 4
PROMPTS, GROUP, LR, SEED = 64, 16, 1e-3, 0
#: One character per token, with the ids of ``grpo_companion.rl.tasks``.
CHARACTERS = {**{str(d): d for d in range(10)}, "+": 10, "=": 11, "$": 12, "^": 13, "_": 14}
EOS, BOS, PAD = 12, 13, 14


class _Clock:
    """Seconds spent in named calls, counted only while ``on`` (the timed steps)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens = 0

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                if self.on:
                    self.seconds[name] += time.perf_counter() - start

        return timed


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def _prompts() -> tuple[list[str], list[str]]:
    """The training prompts of the addition task as text, and their answers."""
    from grpo_companion.rl.tasks import make_arithmetic_task

    task = make_arithmetic_task(seed=SEED)
    pairs = task.operands[task.train_idx]
    return ([f"^{a:02d}+{b:02d}=" for a, b in pairs], [str(a + b) for a, b in pairs])


# ------------------------------------------------------------------------ ours
def run_ours(steps: int, warmup: int) -> dict[str, Any]:
    _one_thread()
    from grpo_companion.rl import trainer as tr
    from grpo_companion.rl.grpo_tasks import SequenceGRPO
    from grpo_companion.rl.policies import TinyCausalTransformer
    from grpo_companion.rl.tasks import EOS as EOS_ID
    from grpo_companion.rl.tasks import PAD as PAD_ID
    from grpo_companion.rl.tasks import VOCAB_SIZE

    iterations = warmup + steps + 1  # the last one is evaluated: not timed
    config = tr.TrainConfig.flat(
        task="sequence", seed=SEED, device="cpu", progress=False, iterations=iterations,
        eval_every=iterations, n_eval_prompts=16, eval_samples=2, sft_steps=0,
        d_model=WIDTH, n_layers=LAYERS, n_heads=HEADS, prompts_per_iteration=PROMPTS,
        group_size=GROUP, mu=1, beta=0.0, clip_eps_low=0.2, loss_type="dapo",
        normalization="mean_std", eps=1e-4, eps_placement="std", ddof=1,
        optimizer="adam", lr=LR, temperature=1.0)
    clock = _Clock()
    # the parts of one GRPO iteration (trainer.grpo_iteration): sampling and rewards are the
    # task's (SequenceGRPO.sample / .score), pi_ref's log-probabilities trainer._fixed_log_probs,
    # the policy's forward pass SequenceGRPO.log_probs and its loss losses.grpo_loss
    sample, score, log_probs = SequenceGRPO.sample, SequenceGRPO.score, SequenceGRPO.log_probs
    reference = tr._fixed_log_probs
    in_reference = [False]

    def counted_sample(*args: Any) -> Any:
        groups = sample(*args)
        if clock.on:
            clock.tokens += int(groups.mask.sum())
        return groups

    def fixed_log_probs(*args: Any) -> Any:
        in_reference[0] = True
        try:
            return reference(*args)
        finally:
            in_reference[0] = False

    timed_forward = clock.wrap("policy_forward", log_probs)

    def policy_log_probs(*args: Any) -> Any:  # pi_ref's pass counts as reference_logprobs
        return log_probs(*args) if in_reference[0] else timed_forward(*args)

    patches = {
        (SequenceGRPO, "sample"): clock.wrap("sampling", counted_sample),
        (SequenceGRPO, "score"): clock.wrap("rewards", score),
        (SequenceGRPO, "log_probs"): policy_log_probs,
        (tr, "_fixed_log_probs"): clock.wrap("reference_logprobs", fixed_log_probs),
        (tr.losses, "grpo_loss"): clock.wrap("loss", tr.losses.grpo_loss),
        (tr.losses, "group_advantages"): clock.wrap("advantages", tr.losses.group_advantages),
        (tr, "grpo_iteration"): clock.wrap("_step", tr.grpo_iteration),
    }
    import torch

    adam_step = torch.optim.Adam.step
    torch.optim.Adam.step = clock.wrap("optimizer_step", adam_step)  # type: ignore[method-assign]
    backward = torch.Tensor.backward
    torch.Tensor.backward = clock.wrap("backward", backward)  # type: ignore[method-assign]
    for (owner, name), value in patches.items():
        setattr(owner, name, value)
    stamps: list[float] = []

    def callback(n: int) -> None:
        stamps.append(time.perf_counter())
        clock.on = warmup <= n < warmup + steps  # the next iteration is timed

    tr.train(config, callback=callback)
    elapsed = stamps[warmup + steps - 1] - stamps[warmup - 1]
    s = defaultdict(float, {k: v / steps for k, v in clock.seconds.items()})
    parts = {
        "sampling": s["sampling"],
        "rewards_advantages": s["rewards"] + s["advantages"],
        "reference_logprobs": s["reference_logprobs"],
        "policy_forward_loss": s["policy_forward"] + s["loss"],
        "backward": s["backward"],
        "optimizer_step": s["optimizer_step"],
    }
    parts["other"] = elapsed / steps - sum(parts.values())
    return {"steps_per_s": steps / elapsed, "tokens_per_s": clock.tokens / elapsed,
            "parameters": sum(p.numel() for p in TinyCausalTransformer(
                VOCAB_SIZE, 10, d_model=WIDTH, n_layers=LAYERS, n_heads=HEADS,
                eos_id=EOS_ID, pad_id=PAD_ID).parameters()),
            "seconds_per_step": parts}


# ------------------------------------------------------------------------- TRL
def _tokenizer() -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(CHARACTERS, unk_token="_"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="^", eos_token="$",
                                   pad_token="_", unk_token="_", padding_side="left")


def run_trl(steps: int, warmup: int) -> dict[str, Any]:
    _one_thread()
    import torch
    from datasets import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=len(CHARACTERS), n_positions=16, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))
    prompts, answers = _prompts()
    data = Dataset.from_dict({"prompt": prompts, "answer": answers})
    clock = _Clock()

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
               answer: list[str], **_: Any) -> list[float]:
        if clock.on:
            clock.tokens += sum(len(ids) for ids in completion_ids)
        targets = [[int(c) for c in a] + [EOS] for a in answer]
        return [float(list(ids[:len(t)]) == t) for ids, t in zip(completion_ids, targets,
                                                                  strict=True)]

    stamps: list[float] = []
    optimizer_start = [0.0]

    class Stamps(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())
            clock.on = warmup <= state.global_step < warmup + steps

        def on_pre_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            optimizer_start[0] = time.perf_counter()

        def on_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
            if clock.on:
                clock.seconds["optimizer_step"] += time.perf_counter() - optimizer_start[0]

    with tempfile.TemporaryDirectory() as folder:
        args = GRPOConfig(
            output_dir=folder, per_device_train_batch_size=PROMPTS * GROUP,
            num_generations=GROUP, max_completion_length=3, num_iterations=1, beta=0.0,
            epsilon=0.2, loss_type="dapo", scale_rewards="group", temperature=1.0,
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=0.0, max_steps=warmup + steps, logging_strategy="no",
            save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
            disable_tqdm=True, seed=SEED, dataloader_num_workers=0, log_completions=False)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                              processing_class=_tokenizer(), callbacks=[Stamps()])
        for name, label in (("_generate_single_turn", "sampling"),
                            ("_calculate_rewards", "rewards"),
                            ("_generate_and_score_completions", "_generate_and_score"),
                            ("compute_loss", "policy_forward_loss")):
            setattr(trainer, name, clock.wrap(label, getattr(trainer, name)))
        trainer.accelerator.backward = clock.wrap("backward", trainer.accelerator.backward)
        trainer.train()
    elapsed = stamps[warmup + steps - 1] - stamps[warmup - 1]
    s = {k: v / steps for k, v in clock.seconds.items()}
    parts = {
        "sampling": s["sampling"],
        "rewards": s["rewards"],
        "other_generate_and_score": s["_generate_and_score"] - s["sampling"] - s["rewards"],
        "policy_forward_loss": s["policy_forward_loss"],
        "backward": s["backward"],
        "optimizer_step": s["optimizer_step"],
    }
    parts["other"] = elapsed / steps - sum(parts.values())
    return {"steps_per_s": steps / elapsed, "tokens_per_s": clock.tokens / elapsed,
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds_per_step": parts}


# ---------------------------------------------------------------------- driver
def _measure(which: str, steps: int, warmup: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error"}
    out = subprocess.run([sys.executable, __file__, "--one", which, "--steps", str(steps),
                          "--warmup", str(warmup)], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{which} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    parts = runs[0]["seconds_per_step"]
    return {"steps_per_s": statistics.median(r["steps_per_s"] for r in runs),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "steps_per_s_each_repeat": [round(r["steps_per_s"], 3) for r in runs],
            "parameters": runs[0]["parameters"],
            "seconds_per_step": {k: statistics.median(r["seconds_per_step"][k] for r in runs)
                                 for k in parts}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=4, help="runs of each trainer")
    parser.add_argument("--one", choices=("ours", "trl"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run = run_ours if args.one == "ours" else run_trl
        print(json.dumps(run(args.steps, args.warmup)))
        return
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for r in range(args.repeats):
        for which in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
            runs[which].append(_measure(which, args.steps, args.warmup))
    ours, trl = _median_of(runs["ours"]), _median_of(runs["trl"])
    import torch
    import trl as trl_module

    print(json.dumps({
        "settings": {"prompts_per_step": PROMPTS, "group_size": GROUP, "mu": 1, "beta": 0.0,
                     "max_new_tokens": 3, "width": WIDTH, "layers": LAYERS, "heads": HEADS,
                     "loss_type": "dapo", "scale_rewards": "group", "threads": 1,
                     "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                     "torch": torch.__version__, "trl": trl_module.__version__},
        "ours": ours, "trl": trl,
        "ratio_steps_per_s": ours["steps_per_s"] / trl["steps_per_s"],
        "ratio_tokens_per_s": ours["tokens_per_s"] / trl["tokens_per_s"],
    }, indent=2))


if __name__ == "__main__":
    main()
