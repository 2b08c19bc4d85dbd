"""Figures (and a table) that hold TRL's answers against the theory's (chapter 11).

Each function draws one comparison from the results of
:mod:`grpo_companion.practice.trl_questions` and
:class:`~grpo_companion.practice.trl_bandit.TRLBandit` and returns the
``matplotlib`` figure; nothing here computes a number the figure shows, except the
theory's curves on a dense grid, from the same functions.

- :func:`settle_figure`: where TRL runs settled against the limits predicted for their
  own ``GRPOConfig``;
- :func:`drift_figure`: TRL's exact expected drift against
  :func:`~grpo_companion.practice.trl_questions.expected_drift`;
- :func:`batch_figure`: what ``scale_rewards="batch"`` does to a prompt's weights and
  fixed point;
- :func:`rounds_figure`: generation rounds of TRL's loss (``num_iterations``, clip)
  against the theory's round and Theorem 2's iteration;
- :func:`options_table`: all of them at a glance, as a Markdown table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_companion.practice import trl_questions
from grpo_companion.practice.trl_bridge import TheoryReading, predict_limits, theory_reading

__all__ = ["COLORS", "batch_figure", "drift_figure", "options_table", "rounds_figure",
           "settle_figure"]

#: One colour per series, in the order the chapter draws them.
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#7f7f7f", "#ff7f0e", "#9467bd")


def _colors(keys: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    if colors is not None:
        missing = [k for k in keys if k not in colors]
        if missing:
            raise ValueError(f"colors must give a colour to every series, missing {missing}")
        return dict(colors)
    return {k: COLORS[i % len(COLORS)] for i, k in enumerate(keys)}


def _run_label(reading: TheoryReading, default_beta: float | None = None) -> str:
    """A legend label for a run's settings: its ``beta`` and its KL estimator."""
    if reading.beta == 0:
        return (r"$\beta = 0$" + (" (TRL's default)" if default_beta == 0 else "")
                + ": no KL")
    return (rf"$\beta = {reading.beta:g}$, use_bias_correction_kl={reading.kl == 'k3_ratio'} "
            f"({reading.kl}, {reading.kl_target} KL)")


def settle_figure(runs: Mapping[str, Any], settled: Mapping[str, tuple[Any, Any]],
                  p_ref: Any, *, title: str = "", colors: Mapping[str, str] | None = None,
                  default_beta: float | None = None) -> Any:
    """Where each run settled (markers, +-2 standard errors) against its predicted limit.

    ``runs``: name to :class:`~grpo_companion.practice.trl_callback.PoSProbeCallback`
    (its ``reading``); ``settled``: name to the ``(mean, standard_error)`` of
    :func:`~grpo_companion.practice.trl_questions.settled_pos`; ``p_ref``: the prompts'
    reference PoS. Lines: the limit
    :func:`~grpo_companion.practice.trl_bridge.predict_limits` gives for each run's
    settings over ``p_ref`` in ``(0, 1)``; the grey diagonal is ``p = p_ref``.
    """
    import matplotlib.pyplot as plt

    if set(settled) != set(runs):
        raise ValueError(f"settled must have the runs' names {sorted(runs)}, got {sorted(settled)}")
    color = _colors(list(runs), colors)
    grid = np.linspace(0.01, 0.99, 99)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.plot([0, 1], [0, 1], color="#7f7f7f", lw=1, label="$p = p_{\\mathrm{ref}}$")
    for name, probe in runs.items():
        ax.plot(grid, predict_limits(grid, probe.reading)[0], color=color[name], lw=1.4,
                label=_run_label(probe.reading, default_beta))
        mean, se = settled[name]
        ax.errorbar(p_ref, mean, yerr=2 * np.asarray(se), fmt="o", ms=5, color=color[name],
                    capsize=3)
    ax.set(xlabel=r"reference PoS $p_{\mathrm{ref}}$ (exact)",
           ylabel="PoS where the run settles", xlim=(0, 1), ylim=(0, 1.03))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def drift_figure(comparisons: Mapping[str, trl_questions.DriftComparison],
                 configs: Mapping[str, Any], p_ref: float, *, title: str = "",
                 colors: Mapping[str, str] | None = None) -> Any:
    """TRL's exact expected drift (markers) and zeros (circles) against the theory's drift.

    ``comparisons``: label to :func:`~grpo_companion.practice.trl_questions.compare_drift`'s
    result; ``configs``: label to the ``GRPOConfig`` it was made with, whose
    :func:`~grpo_companion.practice.trl_questions.expected_drift` is drawn on a dense grid.
    """
    import matplotlib.pyplot as plt

    color = _colors(list(comparisons), colors)
    fig, ax = plt.subplots(figsize=(7, 4.4))
    dense = np.linspace(0.01, 0.99, 400)
    for label, d in comparisons.items():
        args, s = configs[label], d.reading
        name = (f"scale_rewards={args.scale_rewards!r}, "
                + (f"use_bias_correction_kl={s.kl == 'k3_ratio'} ({s.kl}), $\\beta = {s.beta:g}$"
                   if s.beta > 0 else "$\\beta = 0$, no KL"))
        ax.plot(dense, trl_questions.expected_drift(dense, p_ref, args), color=color[label],
                lw=1.4, label=name)
        ax.plot(d.p, d.measured, "o", ms=3.5, color=color[label])
        if d.trl_fp is not None:
            ax.plot([d.trl_fp], [0], "o", ms=9, mfc="none", color=color[label])
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(p_ref, color="black", ls=":", lw=0.8)
    ax.set(xlabel="PoS $p$ of the sampling policy",
           ylabel="expected gradient in the success logit")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7.5, loc="lower left")
    return fig


def batch_figure(p_ref: float, batch_args: Any, group_args: Any, q_grid: Any,
                 fp_batch: Any, *, n_dense: int = 193) -> Any:
    """``scale_rewards="batch"`` against group scaling, two panels.

    Left: the total weight ``Omega(p; q)`` of
    :func:`~grpo_companion.practice.trl_questions.batch_weights` for the other prompts at
    ``q = 0, 0.5, 1``, against group scaling's ``Omega_G(p)`` (dashed; the calibration of
    ``group_args``). Right: ``fp_batch``, the prompt's fixed point for each ``q`` of
    ``q_grid``, against group scaling's :func:`~grpo_companion.practice.trl_questions.fixed_point`.
    """
    import matplotlib.pyplot as plt

    group_cal = theory_reading(group_args).calibration
    group = int(batch_args.num_generations)
    n_prompts = int(batch_args.generation_batch_size) // group
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    dense = np.linspace(0.02, 0.98, n_dense)
    left.plot(dense, np.add(*group_cal.weights(dense)), "k--", lw=1.2,
              label="group scaling $\\Omega_G(p)$")
    for q, color in zip((0.0, 0.5, 1.0), ("#1f77b4", "#ff7f0e", "#2ca02c"), strict=True):
        left.plot(dense, np.add(*trl_questions.batch_weights(dense, q, batch_args)), color=color,
                  label=f"batch scaling, others at $q = {q:g}$")
    left.set(xlabel="PoS $p$ of the prompt", ylabel=r"$\Omega = w^+ + w^-$")
    left.set_title(f"Batch of {n_prompts} prompts x {group} completions", fontsize=10)
    left.legend(fontsize=8)
    right.plot(q_grid, fp_batch, "o-", color="#9467bd", ms=4, label="batch scaling")
    right.axhline(trl_questions.fixed_point(p_ref, group_args), color="black", ls="--", lw=1.2,
                  label="group scaling")
    right.set(xlabel="PoS $q$ of the other prompts of the batch",
              ylabel="fixed point of the prompt")
    beta = theory_reading(batch_args).beta
    right.set_title(rf"$p_{{\mathrm{{ref}}}} = {p_ref:g}$, $\beta = {beta:g}$", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def rounds_figure(rounds: Mapping[str, trl_questions.RoundComparison],
                  paths: Mapping[str, Any], theorem2: Any, fixed_point: float, *,
                  colors: Mapping[str, str] | None = None) -> Any:
    """Generation rounds of TRL's loss against the theory's, two panels.

    Left: for each clip setting in ``rounds`` (label to
    :func:`~grpo_companion.practice.trl_questions.compare_round`'s result, all with the same
    ``mu``), TRL's round after each number of steps (markers), solved (a cross at the right)
    and the theory's round (a line).
    Right: ``paths`` (label to the PoS over rounds) against Theorem 2's iteration
    ``theorem2`` (thick grey) and ``fixed_point`` (dashed). ``colors``: label to colour
    for the left panel (default: :data:`COLORS` in order).
    """
    import matplotlib.pyplot as plt

    color = _colors(list(rounds), colors)
    marks = [("o", 9), ("s", 4), ("^", 6), ("D", 4)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    mu_values = next(iter(rounds.values())).mu
    x_solved = mu_values[-1] * 2.5
    for i, (label, d) in enumerate(rounds.items()):
        upper = "no bound" if d.clip_high > 1e6 else f"1 + {d.clip_high:g}"
        lower = "no bound" if d.clip_low >= 1 else f"1 - {d.clip_low:g}"
        marker, size = marks[i % len(marks)]
        left.plot(d.mu, d.stepped, marker, ms=size, color=color[label],
                  label=f"{label}: [{lower}, {upper}]")
        left.plot([x_solved], [d.solved], "x", ms=9, mew=2, color=color[label])
        left.axhline(d.predicted, color=color[label], lw=1.2)
    left.set_xscale("log", base=2)
    left.set_xticks(list(mu_values) + [x_solved], [str(m) for m in mu_values] + ["solved"])
    left.set(xlabel=r"gradient steps per round $\mu$ (num_iterations)",
             ylabel="PoS after one round")
    left.set_title("One round from the reference: TRL (markers), theory (lines)", fontsize=10)
    left.legend(fontsize=8)
    n_axis = np.arange(len(theorem2))
    right.plot(n_axis, theorem2, color="black", lw=2.5, alpha=0.35,
               label="Theorem 2 (theory.iterate)")
    for (key, path), c in zip(paths.items(), ("#7f7f7f", "#1f77b4", "#2ca02c", "#ff7f0e"),
                              strict=False):
        right.plot(n_axis, path, "o-", ms=3, lw=1.2, color=c, label=key)
    right.axhline(fixed_point, color="black", ls="--", lw=1, label="fixed point")
    right.set(xlabel="generation round $n$", ylabel="PoS")
    right.set_title("Rounds of TRL's loss and the recurrence", fontsize=10)
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _drift_row(d: trl_questions.DriftComparison) -> tuple[str, str, str]:
    s = d.reading
    option = (f"`beta`={s.beta:g}, `use_bias_correction_kl`={s.kl == 'k3_ratio'}, "
              f"{s.calibration.normalization} calibration, G = {s.group_size}")
    if d.theory_fp is None:
        theory_says = "no anchor: no interior fixed point, PoS to 1"
    else:
        theory_says = f"{s.kl}: {s.kl_target} KL, fixed point {d.theory_fp:.4f}"
    zero = ("TRL's gradient has no zero in (0, 1)" if d.trl_fp is None
            else f"zero of TRL's gradient {d.trl_fp:.4f}")
    return option, theory_says, (f"advantages to {d.table_gap:.0e}, drift to "
                                 f"{d.drift_gap:.0e}; {zero}")


def options_table(drift: Mapping[str, trl_questions.DriftComparison],
                  batch: trl_questions.BatchComparison,
                  lengths: Mapping[str, trl_questions.LengthComparison],
                  rounds: Mapping[str, trl_questions.RoundComparison],
                  paths: Mapping[str, Any], theorem2: Any, *, title: str = "option") -> str:
    """The options at a glance: a Markdown table, one row per option measured.

    Columns: the option, what the theory says, and what TRL's own code gave, from
    :func:`~grpo_companion.practice.trl_questions.compare_drift` (one row per
    configuration), :func:`~grpo_companion.practice.trl_questions.compare_batch`,
    :func:`~grpo_companion.practice.trl_questions.compare_lengths` (all loss types with
    the same lengths: two rows, equal and unequal) and
    :func:`~grpo_companion.practice.trl_questions.compare_round` with the multi-round
    ``paths`` (label to PoS over rounds; ``"rounds solved, no clip"`` among them) against
    Theorem 2's iteration ``theorem2``. ``title`` heads the first column.
    """
    if "rounds solved, no clip" not in paths:
        raise ValueError(f"paths must hold 'rounds solved, no clip', got {sorted(paths)}")
    fixed_point = next(iter(lengths.values())).theory_equal
    rows = [_drift_row(d) for d in drift.values()]
    rows.append(("`scale_rewards`='batch'", "no per-prompt calibration",
                 f"advantages = formula to {batch.formula_gap:.0e}; Omega from "
                 f"{batch.omega_batch.min():.2f} to {batch.omega_batch.max():.2f} (group: "
                 f"{batch.omega_group:.2f}); fixed point from {batch.fp_batch.min():.3f} to "
                 f"{batch.fp_batch.max():.3f} (group: {batch.fp_group:.3f})"))
    unequal = next(iter(lengths.values())).lengths
    rows.append(("`loss_type`, equal lengths", f"fixed point {fixed_point:.4f}",
                 "; ".join(f"{t} {d.trl_equal:.4f}" for t, d in lengths.items())))
    rows.append((f"`loss_type`, lengths {unequal[0]} and {unequal[1]}",
                 "; ".join(f"{t} " + ("no formula" if d.theory_unequal is None
                                      else f"{d.theory_unequal:.4f}") for t, d in lengths.items()),
                 "; ".join(f"{t} {d.trl_unequal:.4f}" for t, d in lengths.items())))
    clipped = [d for d in rounds.values() if d.clip_low < 1]
    rows.append(("`epsilon`, `epsilon_high`",
                 "idle on policy; cap each round; fixed point unchanged",
                 "solved round = the theory's clipped round to "
                 f"{max(abs(d.solved - d.predicted) for d in clipped):.0e}"))
    gap = np.abs(np.asarray(paths["rounds solved, no clip"]) - np.asarray(theorem2)).max()
    rows.append(("`num_iterations`", "many steps, no clip: Theorem 2's step `theory.pos_map`",
                 f"solved rounds = Theorem 2's iteration to {gap:.0e}; after "
                 f"{len(theorem2) - 1} rounds, gap to the fixed point: "
                 + ", ".join(f"{k} {abs(p[-1] - fixed_point):.0e}" for k, p in paths.items())))
    lines = [f"| {title} | what the theory says | measured with TRL's code |", "|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} |" for a, b, c in rows])
