"""What the theory predicts for your GRPO run, before you start it: :func:`diagnose`.

Give it a ``trl.GRPOConfig`` (or a dict of its fields, or a JSON file of one) and the
reference success rate of each of your prompts (an array, or a CSV from your own
evaluation). It answers, per prompt and for the batch:

- **the share of zero-variance groups** (TRL's ``frac_reward_zero_std``): a group of
  ``G = num_generations`` completions of a prompt with PoS ``p`` has all rewards equal
  with probability ``p**G + (1 - p)**G`` (:func:`zero_variance_prob`), and then every
  advantage in it is 0. The expected share of a batch holding one group per prompt is
  the mean of that over the prompts (:func:`zero_variance_share`), at the reference and
  where the prompts settle;
- **where each prompt settles, and how fast**: the limit of the paper's recurrence
  (Theorem 2, with the finite-group weights of the run's ``scale_rewards`` and ``G``;
  the reverse-KL analogue for plain k3; PoS 1 at ``beta = 0``) and the number of GRPO
  iterations (generation rounds, each solved exactly) it takes to cover 90 % of the way;
- **which prompts cannot move at this G**: a prompt learns only from groups that hold
  both a success and a failure. ``p_ref = 0`` is absorbing; otherwise a prompt whose
  ``rounds`` groups are more likely than not all to be uniform,
  ``(1 - q)**rounds >= 1/2`` with ``q = 1 - p**G - (1 - p)**G``, is flagged;
- **the settings the theory does not cover**, each with its reason
  (:func:`grpo_companion.practice.trl_coverage.outside_reasons`); then nothing is
  predicted per prompt, and the diagnosis says why.

It reads the config through the one bridge to the theory,
:func:`grpo_companion.practice.trl_bridge.theory_reading`, as
:class:`~grpo_companion.practice.trl_callback.PoSProbeCallback` does.
:func:`group_size_needed` answers the converse question: the smallest ``G`` that lifts
a prompt from ``p_ref`` above a target within ``n`` iterations.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from grpo_companion.practice.trl_bridge import (
    TheoryReading,
    predict_limits,
    predict_path,
    theory_reading,
)

__all__ = [
    "SETTLE_FRACTION",
    "Diagnosis",
    "diagnose",
    "group_size_needed",
    "read_config",
    "read_p_ref",
    "zero_variance_prob",
    "zero_variance_se",
    "zero_variance_share",
]

#: A prompt's way to its limit that counts as "settled" (90 %).
SETTLE_FRACTION = 0.9


# ----------------------------------------------------------------- zero-variance groups
def _check_group_size(group_size: Any, name: str = "group_size") -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or group_size < 2:
        raise ValueError(f"{name} must be an int >= 2 (a group needs two completions to "
                         f"compare), got {group_size!r}")
    return int(group_size)


def _check_probabilities(p: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be probabilities in [0, 1], got {p!r}") from None
    if arr.size == 0:
        raise ValueError(f"{name} must hold at least one probability")
    bad = ~((arr >= 0) & (arr <= 1))  # NaN is bad too
    if bad.any():
        raise ValueError(f"{name} must be probabilities in [0, 1]; got {arr[bad].flat[0]!r} "
                         f"at index {int(np.flatnonzero(bad.ravel())[0])}")
    return arr


def zero_variance_prob(p: Any, group_size: int) -> np.ndarray:
    """``p**G + (1 - p)**G``: the probability that a group of ``G`` has all rewards equal.

    Exact at ``p = 0`` and ``p = 1`` (probability 1); computed as powers, never as
    ``1 - (...)``, so that it keeps its relative precision near 0.
    """
    g = _check_group_size(group_size)
    p = _check_probabilities(p, "p")
    return np.power(p, g) + np.power(1.0 - p, g)


def zero_variance_share(p: Any, group_size: int) -> float:
    """Expected share of zero-variance groups in a batch of one group per prompt (mean of
    :func:`zero_variance_prob` over the prompts' PoS ``p``)."""
    return float(np.mean(zero_variance_prob(p, group_size)))


def zero_variance_se(p: Any, group_size: int) -> float:
    """Standard error of one batch's observed zero-variance share (one group per prompt).

    Each group is uniform independently with probability ``z_i``
    (:func:`zero_variance_prob`), so the share's variance is ``sum z_i (1 - z_i) / n**2``.
    """
    z = zero_variance_prob(p, group_size).ravel()
    return float(math.sqrt(float(np.sum(z * (1.0 - z)))) / z.size)


# ------------------------------------------------------------------------ reading input
def _grpo_fields() -> dict[str, Any]:
    """Every field of the installed ``trl.GRPOConfig`` with its declared default."""
    from grpo_companion.practice.trl_facts import grpo_defaults, installed_trl

    return grpo_defaults(f.name for f in dataclasses.fields(installed_trl().GRPOConfig))


def read_config(config: Any) -> Any:
    """A ``GRPOConfig``-like object from a ``GRPOConfig``, a dict or a JSON file's path.

    A dict (or the JSON object) names ``GRPOConfig`` fields; those it leaves out take the
    installed TRL's defaults, and a name that is not a field is a ``ValueError`` (with
    the closest field names), as are values of the wrong type for the fields the theory
    reads (``num_generations``, ``beta``, ``num_iterations``, ``max_steps``, ...).
    """
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.is_file():
            raise ValueError(f"config {str(path)!r} is not a file")
        try:
            config = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"config {str(path)!r} is not valid JSON: {err}") from None
        if not isinstance(config, dict):
            raise ValueError(f"config {str(path)!r} must hold a JSON object of GRPOConfig "
                             f"fields, got {type(config).__name__}")
    if isinstance(config, dict):
        fields = _grpo_fields()
        for key in config:
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ValueError(f"config: {key!r} is not a field of trl.GRPOConfig{hint}")
        config = SimpleNamespace(**{**fields, **config})
    if not hasattr(config, "num_generations"):
        raise ValueError(f"config must be a trl.GRPOConfig, a dict of its fields or the path "
                         f"of a JSON file of one, got {type(config).__name__}")
    _check_fields(config)
    return config


def _check_int(config: Any, name: str, low: int) -> None:
    value = getattr(config, name, low)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"config: {name} must be an int >= {low}, got {value!r}")


def _check_fields(config: Any) -> None:
    _check_int(config, "num_generations", 2)
    _check_int(config, "num_iterations", 1)
    _check_int(config, "gradient_accumulation_steps", 1)
    if getattr(config, "steps_per_generation", None) is not None:
        _check_int(config, "steps_per_generation", 1)
    max_steps = getattr(config, "max_steps", -1)
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise ValueError(f"config: max_steps must be an int (-1: set by the epochs), "
                         f"got {max_steps!r}")
    beta = getattr(config, "beta", 0.0)
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.number)) \
            or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"config: beta must be a finite number >= 0, got {beta!r}")
    scale = getattr(config, "scale_rewards", "group")
    if scale not in (True, False, "group", "batch", "none"):
        raise ValueError(f"config: scale_rewards must be 'group', 'batch' or 'none' (or a "
                         f"boolean), got {scale!r}")


def read_p_ref(source: Any) -> np.ndarray:
    """Reference success rates, one per prompt, from an array or a CSV file's path.

    The CSV holds one rate per row: either one column, or a header with a column named
    ``p_ref`` (other columns, such as the prompt, are ignored). Every rate must be a
    probability in ``[0, 1]``; an empty file or a value that is not one is a
    ``ValueError`` naming the row.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"p_ref {str(path)!r} is not a file")
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            raise ValueError(f"p_ref {str(path)!r} is not a text (CSV) file") from None
        return _p_ref_from_csv(text, str(path))
    arr = _check_probabilities(source, "p_ref")
    if arr.ndim != 1:
        raise ValueError(f"p_ref must be one rate per prompt (a 1-D array), got shape "
                         f"{arr.shape}")
    return arr


def _p_ref_from_csv(text: str, name: str) -> np.ndarray:
    rows = [row for row in csv.reader(io.StringIO(text)) if any(c.strip() for c in row)]
    if not rows:
        raise ValueError(f"p_ref {name!r} holds no rows")
    header = [c.strip() for c in rows[0]]
    column, start = 0, 0
    if "p_ref" in header:
        column, start = header.index("p_ref"), 1
    elif len(header) != 1:
        raise ValueError(f"p_ref {name!r} has {len(header)} columns and none is named p_ref; "
                         "give one column of rates, or name the column p_ref")
    else:
        try:
            float(header[0])
        except ValueError:
            start = 1  # a one-column header with another name
    values = []
    for line, row in enumerate(rows[start:], start=start + 1):
        cell = row[column].strip() if column < len(row) else ""
        try:
            value = float(cell)
        except ValueError:
            raise ValueError(f"p_ref {name!r}, row {line}: {cell!r} is not a number") from None
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"p_ref {name!r}, row {line}: {value!r} is not a probability in "
                             "[0, 1]")
        values.append(value)
    if not values:
        raise ValueError(f"p_ref {name!r} holds a header but no rates")
    return np.array(values, dtype=np.float64)


# ---------------------------------------------------------------------------- diagnosis
@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found; arrays have one entry per prompt.

    Attributes
    ----------
    reading : TheoryReading
        The theory's reading of the config (``reading.reasons``: settings outside it).
    p_ref : ndarray
    group_size : int
    rounds : int
        Groups of each prompt the run is assumed to draw (for ``stuck``), and
        ``rounds_source``, where that number comes from.
    limit : ndarray
        Where each prompt settles (NaN: no prediction, or it does not settle).
    regime : list of str
        ``fixed_point``, ``saturates``, ``absorbed``, ``cycle_2``, ``irregular``, ``none``.
    iterations : ndarray
        GRPO iterations of the recurrence to cover :data:`SETTLE_FRACTION` of the way from
        ``p_ref`` to ``limit`` (0 when already there; NaN without a limit or beyond
        ``max_iterations``).
    zero_variance_ref, zero_variance_limit : ndarray
        :func:`zero_variance_prob` at ``p_ref`` and at ``limit``.
    stuck : ndarray of bool
        Prompts that cannot move at this ``G`` (see the module docstring).
    why_stuck : list of str
        The reason, ``""`` for a prompt that can move.
    """

    reading: TheoryReading
    p_ref: np.ndarray
    group_size: int
    rounds: int
    rounds_source: str
    limit: np.ndarray
    regime: list[str]
    iterations: np.ndarray
    zero_variance_ref: np.ndarray
    zero_variance_limit: np.ndarray
    stuck: np.ndarray
    why_stuck: list[str]

    @property
    def predicts(self) -> bool:
        """Whether the theory covers the config (else see ``uncovered``)."""
        return self.reading.predicts

    @property
    def uncovered(self) -> tuple[str, ...]:
        """The settings outside the theory, one ``"name=value: why"`` each."""
        return self.reading.reasons

    @property
    def zero_variance_share_ref(self) -> float:
        """Expected ``frac_reward_zero_std`` at the start (one group per prompt)."""
        return float(np.mean(self.zero_variance_ref))

    @property
    def zero_variance_share_limit(self) -> float:
        """Expected ``frac_reward_zero_std`` where the prompts settle (NaN without limits)."""
        return float(np.mean(self.zero_variance_limit))

    def rows(self) -> list[dict[str, Any]]:
        """One dict per prompt: the columns of :meth:`table`."""
        out = []
        for i in range(self.p_ref.size):
            out.append({"prompt": i, "p_ref": float(self.p_ref[i]),
                        "limit": float(self.limit[i]), "regime": self.regime[i],
                        "iterations": float(self.iterations[i]),
                        "zero_variance_ref": float(self.zero_variance_ref[i]),
                        "zero_variance_limit": float(self.zero_variance_limit[i]),
                        "stuck": bool(self.stuck[i]), "why_stuck": self.why_stuck[i]})
        return out

    def table(self, max_rows: int = 40) -> str:
        """The diagnosis as plain text: a summary, then one line per prompt."""
        s = self.reading
        lines = [f"theory: {s.note}",
                 f"G = {self.group_size}; rounds assumed per prompt: {self.rounds} "
                 f"({self.rounds_source})",
                 f"expected frac_reward_zero_std: {self.zero_variance_share_ref:.3f} at the "
                 f"start" + ("" if not self.predicts else
                             f", {self.zero_variance_share_limit:.3f} where the prompts "
                             "settle"),
                 f"prompts that cannot move at this G: {int(self.stuck.sum())} of "
                 f"{self.p_ref.size}"]
        if self.uncovered:
            lines.append("not covered by the theory (nothing is predicted per prompt):")
            lines += [f"  - {reason}" for reason in self.uncovered]
        lines.append("")
        lines.append(f"{'prompt':>6} {'p_ref':>8} {'settles':>8} {'regime':>11} "
                     f"{'iters90%':>8} {'P(unif)':>8} {'at end':>8}  note")
        for row in self.rows()[:max_rows]:
            lines.append(
                f"{row['prompt']:>6} {row['p_ref']:>8.4f} {_num(row['limit'], '.4f'):>8} "
                f"{row['regime']:>11} {_num(row['iterations'], '.0f'):>8} "
                f"{row['zero_variance_ref']:>8.3f} {_num(row['zero_variance_limit'], '.3f'):>8}"
                f"  {row['why_stuck']}")
        if self.p_ref.size > max_rows:
            lines.append(f"... {self.p_ref.size - max_rows} more prompts (see rows())")
        return "\n".join(lines)

    def figure(self) -> Any:
        """Two panels: where each prompt settles against ``p_ref``, and the expected
        zero-variance share along the recurrence (Agg canvas, no pyplot)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(9.5, 4.0), layout="constrained")
        FigureCanvasAgg(fig)
        left, right = fig.subplots(1, 2)
        left.plot([0, 1], [0, 1], color="0.6", lw=1, label="no change")
        if self.predicts:
            grid = np.linspace(0.0, 1.0, 201)
            curve, _ = predict_limits(grid, self.reading)
            left.plot(grid, curve, color="C0", lw=1.5, label="where p_ref settles")
        moving = ~self.stuck
        left.scatter(self.p_ref[moving], np.nan_to_num(self.limit[moving], nan=-1), s=18,
                     color="C0", zorder=3, label="your prompts")
        if self.stuck.any():
            left.scatter(self.p_ref[self.stuck], self.p_ref[self.stuck], s=30, marker="x",
                         color="C3", zorder=3, label="cannot move at this G")
        left.set_xlim(-0.02, 1.02)
        left.set_ylim(-0.02, 1.05)
        left.set_xlabel("reference PoS p_ref", fontsize=11)
        left.set_ylabel("PoS where the prompt settles", fontsize=11)
        left.legend(fontsize=10, loc="lower right")
        n = 40
        if self.predicts:
            path = predict_path(self.p_ref, n, self.reading)
            share = zero_variance_prob(np.clip(path, 0.0, 1.0), self.group_size).mean(1)
            right.plot(np.arange(n + 1), share, "o-", ms=3, color="C1",
                       label="expected frac_reward_zero_std")
        else:
            right.axhline(self.zero_variance_share_ref, color="C1",
                          label="expected frac_reward_zero_std (start)")
            right.text(0.5, 0.5, "no per-prompt prediction:\nsettings outside the theory",
                       ha="center", va="center", transform=right.transAxes, fontsize=11)
        right.set_ylim(-0.02, 1.02)
        right.set_xlabel("GRPO iteration (generation round, solved exactly)", fontsize=11)
        right.set_ylabel("share of groups with equal rewards", fontsize=11)
        right.legend(fontsize=10, loc="lower right")
        for ax in (left, right):
            ax.tick_params(labelsize=10)
        return fig


def _num(x: float, fmt: str) -> str:
    return "-" if not math.isfinite(x) else format(x, fmt)


def _rounds(config: Any, reading: TheoryReading, rounds: int | None) -> tuple[int, str]:
    if rounds is not None:
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
            raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
        return int(rounds), "given"
    max_steps = int(getattr(config, "max_steps", -1))
    if max_steps > 0:
        n = max(1, int(max_steps / reading.steps_per_iteration))
        return n, "max_steps / optimiser steps per generation round"
    return 100, "default: max_steps is not set"


def _settle_iterations(p_ref: np.ndarray, limit: np.ndarray, reading: TheoryReading,
                       max_iterations: int) -> np.ndarray:
    out = np.full(p_ref.size, np.nan)
    known = np.isfinite(limit)
    if not reading.predicts or not known.any():
        return out
    path = predict_path(p_ref, max_iterations, reading)
    gap0 = np.abs(p_ref - limit)
    within = np.abs(path - limit[None, :]) <= (1.0 - SETTLE_FRACTION) * gap0[None, :]
    reached = within.any(0) & known
    out[reached] = np.argmax(within[:, reached], axis=0)
    return out


def diagnose(config: Any, p_ref: Any, *, rounds: int | None = None,
             max_iterations: int = 2000) -> Diagnosis:
    """What the theory predicts for a GRPO run with ``config`` on prompts of PoS ``p_ref``.

    Parameters
    ----------
    config
        A ``trl.GRPOConfig``, a dict of its fields (the rest take the installed TRL's
        defaults) or the path of a JSON file of one (:func:`read_config`).
    p_ref
        The reference policy's success rate on each prompt: an array, or the path of a CSV
        (:func:`read_p_ref`).
    rounds
        Groups of each prompt the run draws, for ``stuck``; default ``max_steps`` over the
        optimiser steps of a generation round (each prompt drawn once per round), or 100
        when ``max_steps`` is not set.
    max_iterations
        Horizon of the recurrence for ``iterations``.

    Returns
    -------
    Diagnosis
        See :class:`Diagnosis`. With a setting outside the theory the per-prompt
        predictions are NaN (regime ``"none"``) and ``uncovered`` lists the reasons; the
        zero-variance share at the reference and the stuck prompts are still given,
        since they depend on sampling only.
    """
    config = read_config(config)
    p_ref = read_p_ref(p_ref)
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int) \
            or max_iterations < 1:
        raise ValueError(f"max_iterations must be an int >= 1, got {max_iterations!r}")
    reading = theory_reading(config)
    group = int(config.num_generations)
    n_rounds, source = _rounds(config, reading, rounds)
    limit, regime = predict_limits(p_ref, reading)
    z_ref = zero_variance_prob(p_ref, group)
    z_limit = np.full(p_ref.size, np.nan)
    finite = np.isfinite(limit)
    if finite.any():
        z_limit[finite] = zero_variance_prob(limit[finite], group)
    # all of a prompt's rounds uniform is more likely than not: log(1 - q) * rounds >= log 1/2
    never_mixed = z_ref ** n_rounds >= 0.5
    why = []
    for p, z, stuck in zip(p_ref, z_ref, never_mixed, strict=True):
        if p == 0:
            why.append("p_ref = 0: no group ever holds a success (absorbing)")
        elif p == 1:
            why.append("p_ref = 1: every group succeeds; nothing to learn")
        elif stuck:
            why.append(f"P(all {n_rounds} groups uniform) = {z ** n_rounds:.2f}: "
                       f"needs G with (p^G + (1-p)^G)^{n_rounds} < 1/2")
        else:
            why.append("")
    return Diagnosis(reading=reading, p_ref=p_ref, group_size=group, rounds=n_rounds,
                     rounds_source=source, limit=limit, regime=regime,
                     iterations=_settle_iterations(p_ref, limit, reading, max_iterations),
                     zero_variance_ref=z_ref, zero_variance_limit=z_limit,
                     stuck=never_mixed,  # p_ref = 0 or 1: every group is uniform
                     why_stuck=why)


def group_size_needed(p_ref: Any, target: float, n_iterations: int, config: Any = None, *,
                      max_group_size: int = 256) -> np.ndarray:
    """The smallest ``num_generations`` whose recurrence lifts each prompt above ``target``.

    For each ``p_ref``, the least ``G`` in ``2..max_group_size`` with
    ``predict_path(p_ref, n_iterations)[-1] >= target`` under ``config`` with
    ``num_generations = G`` (finite-group weights of ``scale_rewards``; Theorem 2's
    recurrence). 0 where no ``G`` up to ``max_group_size`` does it, or where the config
    is outside the theory.
    """
    base = read_config({} if config is None else config)
    p_ref = read_p_ref(p_ref)
    if not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise ValueError(f"target must be a probability in (0, 1], got {target!r}")
    if isinstance(n_iterations, bool) or not isinstance(n_iterations, int) or n_iterations < 1:
        raise ValueError(f"n_iterations must be an int >= 1, got {n_iterations!r}")
    _check_group_size(max_group_size, "max_group_size")
    out = np.zeros(p_ref.size, dtype=np.int64)
    todo = np.ones(p_ref.size, dtype=bool)
    for g in range(2, int(max_group_size) + 1):
        reading = theory_reading(SimpleNamespace(**{**vars(_namespace(base)),
                                                      "num_generations": g}))
        if not reading.predicts:
            return out
        reached = predict_path(p_ref[todo], n_iterations, reading)[-1] >= target
        idx = np.flatnonzero(todo)[reached]
        out[idx] = g
        todo[idx] = False
        if not todo.any():
            break
    return out


def _namespace(config: Any) -> SimpleNamespace:
    if isinstance(config, SimpleNamespace):
        return config
    if dataclasses.is_dataclass(config):
        return SimpleNamespace(**{f.name: getattr(config, f.name)
                                  for f in dataclasses.fields(config)})
    return SimpleNamespace(**vars(config))
