"""The valid values of the chapters' parameters: one table, by name, for every chapter.

A chapter's ``parameters`` cell declares its names and defaults. ``run-chapter -p``
and ``book -p`` check a new value's type against the default
(:func:`grpo_companion.book.pipeline.check_parameter`), then its range here, so
that ``-p beta -1`` is refused with one line, before any cell runs, naming the
parameter and what it accepts.

Names mean the same thing in every chapter (the notation table of the intro):
``beta`` is the KL weight β, ``p_ref`` the reference success probability,
``group_size`` the group size G, ``eps`` the whitening's smoothing ε (never the
clipping half-width, which is ``clip_eps``, κ), ``mu`` the optimiser steps per
round. A name ending in ``s`` (``betas``, ``p_refs``) is a list of such values.
Sizes are ``n_<what>`` (``n_seeds``, ``n_iterations``): a positive integer, or
``None`` for the chapter's own default (smaller in quick mode).

Every name declared by a chapter must have a rule (a test reads every chapter);
to give a chapter a new parameter, add its rule here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from grpo_companion import validation as v

Rule = Callable[[str, object], object]


def _positive(name: str, value: object) -> object:
    v.check_real(name, value, 0.0, open_low=True, scalar=True)
    return value


def _nonnegative(name: str, value: object) -> object:
    v.check_real(name, value, 0.0, scalar=True)
    return value


def _finite(name: str, value: object) -> object:
    v.check_real(name, value, scalar=True)
    return value


def _p_ref(name: str, value: object) -> object:
    v.check_real(name, value, 0.0, 1.0, open_low=True, open_high=True, scalar=True)
    return value


def _mix(name: str, value: object) -> object:
    """The two-KL mix: at 0 or 1 one of the two penalties vanishes and the chapters'
    two-KL rows (``theory.analyses.table1``) are another variant, so both ends are refused."""
    v.check_real(name, value, 0.0, 1.0, open_low=True, open_high=True, scalar=True)
    return value


def _clip_eps(name: str, value: object) -> object:
    v.check_real(name, value, 0.0, 1.0, open_low=True, open_high=True, scalar=True)
    return value


def _count(minimum: int) -> Rule:
    def rule(name: str, value: object) -> object:
        return v.check_count(name, value, minimum)
    return rule


def _size(name: str, value: object) -> object:
    """A size: ``None`` (the chapter's default for its mode) or an integer >= 1."""
    if value is None:
        return None
    try:
        return v.check_count(name, value, 1)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= 1, or None for the chapter's "
                         f"default, got {value!r}") from None


def _flag(name: str, value: object) -> object:
    return v.check_flag(name, value)


def _seed(name: str, value: object) -> object:
    return v.check_seed(name, value)


def _device(name: str, value: object) -> object:
    if not isinstance(value, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", value):
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")
    return value


def _list_of(rule: Rule) -> Rule:
    def check(name: str, value: object) -> object:
        if not isinstance(value, list | tuple) or not value:
            raise ValueError(f"{name} must be a non-empty list, got {value!r}")
        for i, item in enumerate(value):
            rule(f"{name}[{i}]", item)
        return value
    return check


#: name -> rule(name, value), raising ValueError that names the parameter and its range
RULES: dict[str, Rule] = {
    "quick": _flag,
    "seed": _seed,
    "device": _device,
    "beta": _positive,
    "p_ref": _p_ref,
    "group_size": _count(2),
    "eps": _nonnegative,
    "clip_eps": _clip_eps,
    "mu": _count(1),
    "alpha": _mix,
    "lr": _positive,
    "temperature": _positive,
    "xi": _finite,
}
RULES.update({name + "s": _list_of(rule) for name, rule in list(RULES.items())
              if name in {"beta", "p_ref", "group_size", "eps", "clip_eps", "mu", "alpha"}})


def rule_for(name: str) -> Rule | None:
    """The rule of parameter ``name``: from :data:`RULES`, or a size for ``n_*``."""
    if name in RULES:
        return RULES[name]
    if name.startswith("n_") and name[2:].isidentifier():
        return _size
    return None


def check_value(name: str, value: object) -> object:
    """``value`` if it is valid for parameter ``name``; ``ValueError`` otherwise.

    A float in a rule for a number must be finite; a name with no rule raises.
    """
    rule = rule_for(name)
    if rule is None:
        raise ValueError(f"parameter {name!r} has no rule in grpo_companion.book.parameters")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be a number, got nan")
    return rule(name, value)
