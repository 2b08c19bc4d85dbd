"""Practice: this project's GRPO next to Hugging Face TRL's ``GRPOTrainer``.

- :mod:`~grpo_companion.practice.trl_bridge`: a ``GRPOConfig`` in this project's
  vocabulary, for the loss (:func:`~grpo_companion.practice.trl_bridge.loss_settings`)
  and for the theory's prediction
  (:func:`~grpo_companion.practice.trl_bridge.theory_reading`).
- :mod:`~grpo_companion.practice.trl_coverage`: every ``GRPOConfig`` field, classified
  as covered by the theory (with what it maps to), outside it (with why: then nothing
  is predicted) or irrelevant to it.
- :mod:`~grpo_companion.practice.trl_callback`: :class:`PoSProbeCallback`, which
  measures probe prompts' PoS during any ``GRPOTrainer`` run and records the
  theory's prediction next to it.
- :mod:`~grpo_companion.practice.diagnose`: what the theory predicts for a
  ``GRPOConfig`` on your prompts (zero-variance share, settling points and pace,
  stuck prompts, uncovered settings); also ``python -m grpo_companion diagnose``.
- :mod:`~grpo_companion.practice.trl_questions`: the theory's answer to each question
  a practitioner asks of a ``GRPOConfig`` (the advantage TRL computes, the drift and
  fixed point, batch scaling, ``loss_type`` with unequal lengths, a generation round
  with ``num_iterations`` steps and the clip), each tested against TRL's own code;
  :mod:`~grpo_companion.practice.trl_plots` draws them next to TRL's answers.
- :mod:`~grpo_companion.practice.trl_logs`, :mod:`~grpo_companion.practice.trl_bandit`,
  :mod:`~grpo_companion.practice.log_answers` and
  :mod:`~grpo_companion.practice.addition_toy`: chapter 12's logged TRL runs, TRL's
  loss and advantages driven on the bandit, the theory's answers to practitioners'
  questions, and the toy that chapters 11 and 12 train.

Importing this package imports ``transformers`` (not TRL itself); the
translations read the config's attributes only.
"""

from grpo_companion.practice.trl_bridge import (
    TheoryReading,
    advantage_calibration,
    loss_settings,
    theory_reading,
)
from grpo_companion.practice.trl_callback import CSV_COLUMNS, PoSProbeCallback

__all__ = [
    "CSV_COLUMNS",
    "PoSProbeCallback",
    "TheoryReading",
    "advantage_calibration",
    "loss_settings",
    "theory_reading",
]
