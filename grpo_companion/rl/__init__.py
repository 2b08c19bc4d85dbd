"""PyTorch side of the companion: tasks with verifiers, policies, GRPO losses, trainer.

Modules (import what you need; :mod:`~grpo_companion.rl.losses` alone is enough to drop the GRPO
loss into your own loop):

- :mod:`~grpo_companion.rl.losses`: group advantages, per-token clipped loss
  with KL estimators, TRL-style aggregation, exact tabular objective;
- :mod:`~grpo_companion.rl.tasks`: the bandit and the addition task;
- :mod:`~grpo_companion.rl.policies`: tabular softmax and tiny transformer;
- :mod:`~grpo_companion.rl.trainer`: ``TrainConfig`` and ``train`` (Algorithm 1
  and its exact version);
- :mod:`~grpo_companion.rl.long_run`: long runs of the addition task with every
  prompt's exact success probability and Theorem 10's one-step distances (chapter 8);
- :mod:`~grpo_companion.rl.config`: how each ``TrainConfig`` field is declared
  once (help, valid values, TRL name), and the validation, command line and
  TRL name table generated from those declarations;
- :mod:`~grpo_companion.rl.io`: atomic file writes;
- :mod:`~grpo_companion.rl.history`: the append-only metric history that keeps
  every checkpoint the same size;
- :mod:`~grpo_companion.rl.cli`: ``python -m grpo_companion train``.
"""

from grpo_companion.rl import losses
from grpo_companion.rl.trainer import TrainConfig, TrainResult, check_machine, train

__all__ = ["TrainConfig", "TrainResult", "check_machine", "losses", "train"]
