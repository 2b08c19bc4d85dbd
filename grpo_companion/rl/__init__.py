"""PyTorch side of the companion: tasks with verifiers, policies, GRPO losses, trainer.

Modules (import what you need; :mod:`~grpo_companion.rl.losses` alone is enough to drop the GRPO
loss into your own loop):

- :mod:`~grpo_companion.rl.losses`: group advantages, per-token clipped loss
  with KL estimators, TRL-style aggregation, exact tabular objective;
- :mod:`~grpo_companion.rl.tasks`: the bandit and the addition task;
- :mod:`~grpo_companion.rl.policies`: tabular softmax and tiny transformer;
- :mod:`~grpo_companion.rl.trainer`: ``train``, its loop and one GRPO iteration
  (Algorithm 1), read top to bottom;
- :mod:`~grpo_companion.rl.train_config`: ``TrainConfig``, every knob of a run, nested by
  concern (``run``, ``grpo``, ``optim``, ``bandit``, ``sequence``, ``model``), each field
  declared once with its check and its docstring as help;
- :mod:`~grpo_companion.rl.grpo_tasks`: the protocol a task offers the trainer (sample,
  score, log-probabilities, metrics with the PoS), for the bandit and the addition task;
- :mod:`~grpo_companion.rl.exact`: the exact tabular iteration (the paper's recurrence);
- :mod:`~grpo_companion.rl.recorder`: the bookkeeping (``run.json``, history,
  checkpoints, callbacks), one record per iteration;
- :mod:`~grpo_companion.rl.run_state`, :mod:`~grpo_companion.rl.machine`,
  :mod:`~grpo_companion.rl.fingerprint`: a run's state, what it needs of the machine,
  and the digest of the code behind its numbers;
- :mod:`~grpo_companion.rl.long_run`: long runs of the addition task with every
  prompt's exact success probability and Theorem 10's one-step distances (chapter 8);
- :mod:`~grpo_companion.rl.seed_batch`, :mod:`~grpo_companion.rl.stacked`: several seeds
  of those runs trained as one batched computation;
- :mod:`~grpo_companion.rl.checks`: the checks a field's type carries (valid values,
  TRL name), and the TRL name table built from them;
- :mod:`~grpo_companion.rl.io`: atomic file writes;
- :mod:`~grpo_companion.rl.history`: the append-only metric history that keeps
  every checkpoint the same size;
- :mod:`~grpo_companion.rl.cli`: ``python -m grpo_companion train``, derived from
  ``TrainConfig`` by tyro.
"""

from grpo_companion.rl import losses
from grpo_companion.rl.train_config import (
    BanditConfig,
    GRPOConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SequenceConfig,
)
from grpo_companion.rl.trainer import TrainConfig, TrainResult, check_machine, train

__all__ = ["BanditConfig", "GRPOConfig", "ModelConfig", "OptimConfig", "RunConfig",
           "SequenceConfig", "TrainConfig", "TrainResult", "check_machine", "losses", "train"]
