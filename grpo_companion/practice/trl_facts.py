"""The installed TRL's ``GRPOConfig`` defaults, read when called, and what they mean to the theory.

Nothing here is a copy of TRL's numbers: :func:`grpo_defaults` reads the field
defaults of ``trl.GRPOConfig`` from the installed package each time it is
called, and :func:`installed_reading` turns a configuration (those defaults, or any
``GRPOConfig``, its missing fields filled with those defaults) into the
:class:`~grpo_companion.practice.trl_bridge.TheoryReading` of
:mod:`grpo_companion.practice.trl_bridge`, the objects of :mod:`grpo_companion.theory` that
predict it: the calibration of the advantages (``theory.CALIBRATIONS`` with the
group size), the KL estimator of :mod:`grpo_companion.rl.losses` and which
divergence its expected gradient follows
(:data:`grpo_companion.theory.kl_estimators.ESTIMATOR_TARGETS`), and whether
there is a per-prompt prediction at all. :data:`OPTIONS` lists the options
that change the advantage, the KL or the pace, each with what it does to the
PoS recurrence; :func:`option_rows` states that for a configuration's values.

The translation itself is :mod:`grpo_companion.practice.trl_bridge`'s
(:func:`~grpo_companion.practice.trl_bridge.advantage_calibration`), checked
against TRL's own code by ``tests/practice/test_trl_equivalence.py``; this
module adds the defaults and the words. Which values of *every* ``GRPOConfig``
field the theory covers is :mod:`grpo_companion.practice.trl_coverage`'s; a
setting it puts outside the theory makes
:attr:`~grpo_companion.practice.trl_bridge.TheoryReading.predicts` False, with the reasons in
``TheoryReading.reasons``.

Without TRL every function raises :class:`TRLNotInstalledError` (an
``ImportError``) that says how to install it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from grpo_companion.practice.trl_bridge import TheoryReading, theory_reading
from grpo_companion.theory.kl_estimators import ESTIMATOR_TARGETS

__all__ = [
    "OPTIONS",
    "Option",
    "TRLNotInstalledError",
    "describe",
    "grpo_defaults",
    "installed_reading",
    "installed_trl",
    "kl_estimator",
    "option_rows",
    "trl_version",
]


class TRLNotInstalledError(ImportError):
    """TRL cannot be imported; the message says how to install it."""


def installed_trl() -> ModuleType:
    """The ``trl`` module, or :class:`TRLNotInstalledError` with what to do."""
    try:
        return importlib.import_module("trl")
    except ImportError as err:
        raise TRLNotInstalledError(
            f"TRL is not installed here (import trl failed: {err}). Install the version this "
            "project pins in pyproject.toml, e.g. `pip install -r requirements.lock`, or "
            "`pip install trl` for the latest one") from err


def trl_version() -> str:
    """``trl.__version__`` of the installed TRL."""
    return str(installed_trl().__version__)


@dataclass(frozen=True)
class Option:
    """A ``GRPOConfig`` option and what it does to the theory's PoS recurrence.

    Attributes
    ----------
    name : str
        The ``GRPOConfig`` field.
    acts_on : str
        ``"advantage"``, ``"kl"``, ``"surrogate"``, ``"aggregation"``, ``"pace"``
        or ``"sampling"``.
    implies : callable
        ``implies(value, config) -> str``: what this value means for the
        recurrence and its fixed point, given the rest of the configuration.
    """

    name: str
    acts_on: str
    implies: Callable[[Any, Any], str]


def _get(config: Any, name: str, default: Any = None) -> Any:
    return getattr(config, name, default)


def _scale_rewards(value: Any, config: Any) -> str:
    mode = {True: "group", False: "none"}.get(value, value)
    group = _get(config, "num_generations")
    if mode == "group":
        return (f"divide by the group's standard deviation (+1e-4): CALIBRATIONS['trl'] with "
                f"group_size={group}; Theorem 2's recurrence with its finite-group weights")
    if mode == "none":
        return (f"centre only (Dr. GRPO): CALIBRATIONS['mean_only'] with group_size={group}; "
                "the recurrence with the smaller, p-dependent Omega of centring")
    if mode == "batch":
        return ("divide by the standard deviation of the whole batch: a prompt's weights depend "
                "on the other prompts of the batch, so there is no per-prompt recurrence")
    return f"unknown value {value!r}"


def _beta(value: Any, config: Any) -> str:
    if float(value) == 0.0:
        return ("no KL term (and no reference model): the recurrence has no anchor, every "
                "prompt with p_ref > 0 climbs to PoS 1 and 0 stays 0")
    if kl_estimator(config) == "k3_ratio":
        return (f"KL anchor of weight {float(value):g}: with kl='k3_ratio' the interior fixed "
                "points solve logit p = logit p_ref + Omega(p) / beta (forward KL, Theorem 2)")
    return (f"KL anchor of weight {float(value):g}: with plain kl='k3' the interior fixed points "
            "solve p (1 - p) Omega(p) = beta (p - p_ref) (reverse KL), not Theorem 2's")


def _bias_correction(value: Any, config: Any) -> str:
    kl = "k3_ratio" if value else "k3"
    target = ESTIMATOR_TARGETS[kl]
    where = ("the paper's fixed point (Gibbs tilt)" if target == "forward"
             else "the reverse-KL fixed point (rational tilt), not the paper's")
    idle = "; idle while beta = 0" if float(_get(config, "beta", 0.0)) == 0.0 else ""
    return (f"kl='{kl}': its expected gradient is that of the {target} KL, so a run settles at "
            f"{where}{idle}")


def _generations(value: Any, config: Any) -> str:
    return (f"G = {int(value)}: the expected weights of a group of {int(value)} "
            "(theory.finite_group), not the population weights")


def _iterations(value: Any, config: Any) -> str:
    mu = int(value)
    if kl_estimator(config) == "k3_ratio":
        target = ("the round approaches Theorem 2's exact step (the Gibbs tilt) only as mu "
                  "grows, without clipping")
    else:
        target = ("with plain k3 a solved round (theory.analyses.trained_loss.round_step_logit) is "
                  "neither Theorem 2's step nor the reverse-KL step, though it shares the "
                  "latter's fixed points")
    return (f"mu = {mu} optimiser step(s) per generation round: the fixed point does not "
            f"depend on it; {target}")


def _clip_low(value: Any, config: Any) -> str:
    high = _get(config, "epsilon_high")
    high = float(value) if high is None else float(high)
    return (f"ratio clipped to [1 - {float(value):g}, 1 + {high:g}]: idle on the first step of "
            "a round (ratio 1); later steps of a round stop where it binds, which caps a "
            "round's move but not the fixed point (ratio 1 there)")


def _clip_high(value: Any, config: Any) -> str:
    if value is None:
        return "None: the upper clip equals epsilon (symmetric)"
    return f"upper clip 1 + {float(value):g} (DAPO's clip-higher); fixed point unchanged"


def _loss_type(value: Any, config: Any) -> str:
    notes = {
        "grpo": "mean over each completion's tokens, then over completions: a completion "
                "weighs 1/length, so unequal success and failure lengths change the weights "
                "(outside the theory)",
        "dr_grpo": "token sum over a constant (batch x max_completion_length): the "
                   "sequence-level objective up to a constant, so the theory's fixed point",
        "dapo": "token sum over the batch's token count: equal weights within a batch, but the "
                "count varies with the batch's successes when lengths differ",
        "bnpo": "token sum over the local batch's token count (as dapo on one process)",
    }
    return notes.get(value, f"{value!r}: a loss with no counterpart in this project")


def _temperature(value: Any, config: Any) -> str:
    return (f"T = {float(value):g}: sampling and the loss both use logits / T, so the theory "
            "describes the PoS of the tempered policy (the one the probe samples)")


def _learning_rate(value: Any, config: Any) -> str:
    return (f"{float(value):g}: the pace of the steps towards each round's maximiser; the "
            "theory's iteration is that maximiser, so it sets how many steps a round takes, "
            "not where the run settles")


def _delta(value: Any, config: Any) -> str:
    if value is None:
        return "None: no upper bound on the ratio of negative-advantage tokens"
    return f"ratio capped at {float(value):g} for every token (two-sided clip): off-policy only"


def _is_level(value: Any, config: Any) -> str:
    if value == "token":
        return "token: per-token ratios, as the theory's per-output ratio when one token decides"
    return f"{value}: one ratio per sequence (GSPO); the bias-corrected KL is then not exact"


def _entropy(value: Any, config: Any) -> str:
    if float(value) == 0.0 and not _get(config, "use_adaptive_entropy", False):
        return "0: no entropy bonus"
    return "an entropy bonus changes the objective: the fixed point moves (outside the theory)"


def _entropy_quantile(value: Any, config: Any) -> str:
    if float(value) >= 1.0:
        return "1: every token is in the loss"
    return f"{float(value):g}: only high-entropy tokens carry the advantage (outside the theory)"


def _aggregation(value: Any, config: Any) -> str:
    if value == "sum_then_normalize":
        return "sum_then_normalize: one reward per completion, normalised as scale_rewards says"
    return f"{value}: normalised over the batch, so no per-prompt recurrence"


def _truncated(value: Any, config: Any) -> str:
    if not value:
        return "False: truncated completions stay in the loss (scored by the verifier)"
    return "True: truncated completions leave the loss, which reweights the group"


def _sync_ref(value: Any, config: Any) -> str:
    if not value:
        return "False: the reference stays pi_ref, the paper's anchor"
    return ("True: the reference moves towards the policy (its success logit mixed as "
            "a L_n + (1 - a) L_ref every ref_model_sync_steps steps): the moving-reference "
            "recurrence (theory.analyses.staged.moving_reference_iterate), where the syncs fall "
            "between iterations")


def _generation_batch(value: Any, config: Any) -> str:
    return ("generation rounds of steps_per_generation optimiser steps: with more than one, "
            "the later steps of a round are off policy (as mu > 1)")


#: Options that change the advantage, the KL, the surrogate, the aggregation or the pace.
OPTIONS: tuple[Option, ...] = (
    Option("beta", "kl", _beta),
    Option("use_bias_correction_kl", "kl", _bias_correction),
    Option("scale_rewards", "advantage", _scale_rewards),
    Option("num_generations", "advantage", _generations),
    Option("multi_objective_aggregation", "advantage", _aggregation),
    Option("loss_type", "aggregation", _loss_type),
    Option("mask_truncated_completions", "aggregation", _truncated),
    Option("epsilon", "surrogate", _clip_low),
    Option("epsilon_high", "surrogate", _clip_high),
    Option("delta", "surrogate", _delta),
    Option("importance_sampling_level", "surrogate", _is_level),
    Option("top_entropy_quantile", "surrogate", _entropy_quantile),
    Option("entropy_coef", "surrogate", _entropy),
    Option("sync_ref_model", "kl", _sync_ref),
    Option("num_iterations", "pace", _iterations),
    Option("steps_per_generation", "pace", _generation_batch),
    Option("learning_rate", "pace", _learning_rate),
    Option("temperature", "sampling", _temperature),
)

_BY_NAME = {o.name: o for o in OPTIONS}


def grpo_defaults(names: Iterable[str] | None = None) -> dict[str, Any]:
    """Declared defaults of the installed ``trl.GRPOConfig``, read now.

    ``names``: fields to read (default: those of :data:`OPTIONS`). A field the
    installed TRL does not have is left out of the result, so that a reader
    can tell an option that does not exist from its default.
    """
    fields = {f.name: f for f in dataclasses.fields(installed_trl().GRPOConfig)}
    wanted = [o.name for o in OPTIONS] if names is None else list(names)
    out: dict[str, Any] = {}
    for name in wanted:
        field = fields.get(name)
        if field is None:
            continue
        if field.default is not dataclasses.MISSING:
            out[name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            out[name] = field.default_factory()
    return out


def kl_estimator(config: Any) -> str:
    """The loss's KL estimator for a configuration: ``"k3_ratio"`` or ``"k3"``.

    ``use_bias_correction_kl=True`` multiplies TRL's k3 by the importance ratio
    (``"k3_ratio"``); ``False``, or a TRL without the option, is plain ``"k3"``.
    """
    return "k3_ratio" if _get(config, "use_bias_correction_kl", False) else "k3"


class _WithDefaults:
    """``config``'s attributes, and the installed defaults for those it lacks.

    ``use_bias_correction_kl`` is never filled: its absence means a TRL from before the
    option, whose loss is plain k3.
    """

    def __init__(self, config: Any, defaults: dict[str, Any]) -> None:
        self._config, self._defaults = config, defaults

    def __getattr__(self, name: str) -> Any:
        if hasattr(self._config, name):
            return getattr(self._config, name)
        if name in self._defaults and name != "use_bias_correction_kl":
            return self._defaults[name]
        raise AttributeError(name)


def installed_reading(config: Any = None) -> TheoryReading:
    """:func:`~grpo_companion.practice.trl_bridge.theory_reading` as the installed TRL runs it.

    ``config`` is a ``GRPOConfig`` or any object with some of its attribute names; a
    missing attribute takes the installed ``GRPOConfig`` default, except
    ``use_bias_correction_kl``, whose absence means a TRL without the option, that is plain
    k3. ``None`` reads the installed defaults themselves. The reading's ``trl_version`` is
    the installed TRL's.
    """
    defaults = grpo_defaults([f.name for f in dataclasses.fields(installed_trl().GRPOConfig)])
    if config is None:
        config = SimpleNamespace(**defaults)
    elif not dataclasses.is_dataclass(config):
        config = _WithDefaults(config, defaults)
    return dataclasses.replace(theory_reading(config), trl_version=trl_version())


def option_rows(config: Any = None) -> list[dict[str, Any]]:
    """One row per option of :data:`OPTIONS` present in the installed TRL.

    Each row: ``name``, ``default`` (the installed TRL's), ``value`` (``config``'s,
    default: the default), ``acts_on`` and ``implies`` (for ``value``).
    """
    defaults = grpo_defaults()
    if config is None:
        config = SimpleNamespace(**defaults)
    rows = []
    for option in OPTIONS:
        if option.name not in defaults:
            continue
        value = _get(config, option.name, defaults[option.name])
        rows.append({"name": option.name, "default": defaults[option.name], "value": value,
                     "acts_on": option.acts_on, "implies": option.implies(value, config)})
    return rows


def describe(name: str, value: Any, config: Any = None) -> str:
    """What ``name = value`` does to the recurrence (see :data:`OPTIONS`)."""
    if name not in _BY_NAME:
        raise ValueError(f"no entry for {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[name].implies(value, SimpleNamespace(**grpo_defaults()) if config is None
                                  else config)
