"""The paper's Appendix A experiment with TRL, plus the PoS probe of grpo_companion.

Mroueh, arXiv 2503.06639v4, Appendix A ("Experimental Validation", setup) and
Appendix H ("GRPO Config Setup"): GRPO in TRL from Qwen/Qwen2.5-0.5B-Instruct
(the reference policy) on the GSM8K training split, with a 0/1 reward for a
correct final answer, then the success rate of test prompts (50 samples each)
along training. The defaults below are the values those sections give:

========================  =======  ==========================================
setting                   default  where
========================  =======  ==========================================
learning rate             5e-6     App. A
clipping epsilon          0.2      App. A
KL weight beta            0.1      App. A
mu (``num_iterations``)   10       App. A (Algorithm 1, App. B)
group size G              16       App. H
per-device batch          16       App. H (one prompt and its 16 outputs)
gradient accumulation     4        App. H (7 training GPUs: 28 prompts a step)
completion length         200      App. H gives a context length of 200; we
                                   read it as ``max_completion_length``
temperature               0.1      App. H
samples per test prompt   50       App. A
epochs                    1        App. A (one GRPO epoch)
generation                vLLM     App. A (server on GPU 0, 7 training GPUs)
========================  =======  ==========================================

Our choices where the paper is silent (each has a flag): the prompt wording
(``PROMPT``), the answer check (the last number of the completion against the
number after ``####`` in GSM8K's answer), ``loss_type="grpo"`` (the per-sequence
average of the paper's objective, Sec. 2; TRL 1.16's default is ``"dapo"``) and
``use_bias_correction_kl=False``: TRL's option cites DeepSeek-V3.2 (arXiv
2512.02556, December 2025), later than the paper, so the paper's runs used
the plain k3 estimator, whose expected gradient follows KL(pi_ref || pi);
``--kl-bias-correction`` follows KL(pi || pi_ref), the divergence the paper's
analysis uses. The probe's predicted columns follow whichever is chosen
(:mod:`grpo_companion.practice.trl_bridge`).

Run (8 GPUs, as in the paper; needs ``pip install vllm`` and the weights)::

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct &
    CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 accelerate launch --num_processes 7 \\
        scripts/appendix_a_trl.py --output-dir runs/appendix_a

``--no-vllm`` generates with ``transformers`` instead (one GPU works, slowly).
``--dry-run`` builds and prints the configuration and the theory's reading
without loading a model or a dataset. The probe writes ``pos_probe.csv``,
``pos_probe.png`` and ``pos_probe.json`` under ``<output-dir>/probe``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

#: The paper's values (Appendix A and H), the defaults of the command line.
PAPER = {
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "learning_rate": 5e-6,
    "epsilon": 0.2,
    "beta": 0.1,
    "num_iterations": 10,
    "num_generations": 16,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 4,
    "max_completion_length": 200,
    "temperature": 0.1,
    "probe_samples": 50,
    "num_train_epochs": 1,
    "training_processes": 7,
}

PROMPT = ("{question}\nSolve the problem step by step, then give the final answer as a "
          "number after '####'.")

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def gold_answer(answer: str) -> str:
    """The number after ``####`` in a GSM8K answer, without thousands separators."""
    return answer.split("####")[-1].strip().replace(",", "")


def predicted_answer(completion: str) -> str | None:
    """The number the completion ends on (after its last ``####`` when there is one)."""
    tail = completion.split("####")[-1]
    numbers = _NUMBER.findall(tail) or _NUMBER.findall(completion)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def is_correct(completion: str, gold: str) -> int:
    """1 when the completion's final number equals the gold number, else 0."""
    guess = predicted_answer(completion)
    if guess is None:
        return 0
    try:
        return int(abs(float(guess) - float(gold)) < 1e-9)
    except ValueError:
        return 0


def _text(completion: Any) -> str:
    """A TRL completion (text, or a list of messages) as text."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion if isinstance(m, dict))


def correctness_reward(prompts, completions, answer, **_):
    """TRL reward function: 1.0 for a correct final answer, 0.0 otherwise."""
    return [float(is_correct(_text(c), gold_answer(a)))
            for c, a in zip(completions, answer, strict=True)]


def to_prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPT.format(question=question)}]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="GRPO on GSM8K from Qwen2.5-0.5B-Instruct with TRL, as in Appendix A of "
                    "Mroueh (arXiv 2503.06639v4), with grpo_companion's PoS probe.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=PAPER["model"], help="reference policy (App. A)")
    p.add_argument("--output-dir", default="runs/appendix_a_trl")
    p.add_argument("--learning-rate", type=float, default=PAPER["learning_rate"])
    p.add_argument("--epsilon", type=float, default=PAPER["epsilon"], help="clipping")
    p.add_argument("--beta", type=float, default=PAPER["beta"], help="KL weight")
    p.add_argument("--mu", type=int, default=PAPER["num_iterations"],
                   help="passes over each generation batch (TRL num_iterations)")
    p.add_argument("--group-size", type=int, default=PAPER["num_generations"], help="G")
    p.add_argument("--per-device-batch", type=int, default=PAPER["per_device_train_batch_size"])
    p.add_argument("--grad-accum", type=int, default=PAPER["gradient_accumulation_steps"])
    p.add_argument("--max-completion-length", type=int, default=PAPER["max_completion_length"])
    p.add_argument("--temperature", type=float, default=PAPER["temperature"])
    p.add_argument("--epochs", type=float, default=PAPER["num_train_epochs"])
    p.add_argument("--max-steps", type=int, default=-1, help="stop early (smoke runs)")
    p.add_argument("--loss-type", default="grpo", choices=["grpo", "bnpo", "dr_grpo", "dapo"])
    p.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"])
    p.add_argument("--kl-bias-correction", action=argparse.BooleanOptionalAction, default=False,
                   help="TRL use_bias_correction_kl (see the module docstring)")
    p.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=True,
                   help="generate with a vLLM server (trl vllm-serve)")
    p.add_argument("--vllm-host", default="0.0.0.0")
    p.add_argument("--vllm-port", type=int, default=8000)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--probe-prompts", type=int, default=8,
                   help="random GSM8K test prompts followed by the probe")
    p.add_argument("--probe-samples", type=int, default=PAPER["probe_samples"],
                   help="samples per probe prompt and measurement (App. A)")
    p.add_argument("--probe-every", type=int, default=10,
                   help="optimiser steps between probe measurements (10 = one GRPO iteration "
                        "with the defaults)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-to", default="none", help="TRL/transformers report_to")
    p.add_argument("--overwrite", action="store_true", help="replace existing probe files")
    p.add_argument("--dry-run", action="store_true",
                   help="build and print the configuration; load no model and no data")
    return p.parse_args(argv)


def _bf16_available() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def build_config(ns: argparse.Namespace, *, dry_run: bool = False):
    """The ``GRPOConfig`` of these arguments.

    A dry run on a machine without bf16 (this project's CPU CI) builds it in fp32,
    since transformers refuses bf16 there; the printed summary says so.
    """
    from trl import GRPOConfig

    bf16 = ns.precision == "bf16" and not (dry_run and not _bf16_available())
    return GRPOConfig(
        output_dir=ns.output_dir,
        learning_rate=ns.learning_rate,
        epsilon=ns.epsilon,
        beta=ns.beta,
        num_iterations=ns.mu,
        num_generations=ns.group_size,
        per_device_train_batch_size=ns.per_device_batch,
        gradient_accumulation_steps=ns.grad_accum,
        max_completion_length=ns.max_completion_length,
        temperature=ns.temperature,
        num_train_epochs=ns.epochs,
        max_steps=ns.max_steps,
        loss_type=ns.loss_type,
        scale_rewards=ns.scale_rewards,
        use_bias_correction_kl=ns.kl_bias_correction,
        use_vllm=ns.vllm,
        vllm_mode="server",
        vllm_server_host=ns.vllm_host,
        vllm_server_port=ns.vllm_port,
        bf16=bf16,
        seed=ns.seed,
        report_to=[] if ns.report_to == "none" else [ns.report_to],
        logging_steps=1,
        save_strategy="no",
    )


def summary(ns: argparse.Namespace, config) -> dict[str, Any]:
    """What the run will do, and what the theory is told about it."""
    from grpo_companion.practice.trl_bridge import theory_reading

    reading = theory_reading(config)
    processes = PAPER["training_processes"]
    prompts = processes * config.per_device_train_batch_size * config.gradient_accumulation_steps
    return {
        "model": ns.model,
        "grpo_config": {k: getattr(config, k) for k in (
            "learning_rate", "epsilon", "epsilon_high", "beta", "num_iterations",
            "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps",
            "steps_per_generation", "max_completion_length", "temperature", "num_train_epochs",
            "max_steps", "loss_type", "scale_rewards", "use_bias_correction_kl", "use_vllm",
            "vllm_mode", "bf16", "seed")},
        "precision_requested": ns.precision,
        "prompts_per_step_on_7_training_gpus": prompts // config.num_generations,
        "probe": {"prompts": ns.probe_prompts, "samples": ns.probe_samples,
                  "every": ns.probe_every, "dir": str(Path(ns.output_dir) / "probe")},
        "theory": reading.record(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    config = build_config(ns, dry_run=ns.dry_run)
    if ns.dry_run:
        print(json.dumps(summary(ns, config), indent=2, default=str))
        return 0

    from datasets import load_dataset
    from trl import GRPOTrainer

    from grpo_companion.practice import PoSProbeCallback

    train = load_dataset("openai/gsm8k", "main", split="train")
    train = train.map(lambda row: {"prompt": to_prompt(row["question"])})
    test = load_dataset("openai/gsm8k", "main", split="test")
    picked = random.Random(ns.seed).sample(range(len(test)), ns.probe_prompts)
    probes = [to_prompt(test[i]["question"]) for i in picked]
    golds = {p[-1]["content"]: gold_answer(test[i]["answer"])
             for p, i in zip(probes, picked, strict=True)}

    def verifier(prompt, completion: str) -> int:
        return is_correct(completion, golds[prompt[-1]["content"]])

    probe = PoSProbeCallback(probes, verifier, Path(ns.output_dir) / "probe",
                             every=ns.probe_every, n_samples=ns.probe_samples,
                             overwrite=ns.overwrite, seed=ns.seed)
    trainer = GRPOTrainer(model=ns.model, reward_funcs=correctness_reward, args=config,
                          train_dataset=train, callbacks=[probe])
    trainer.train()
    trainer.save_model(ns.output_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
