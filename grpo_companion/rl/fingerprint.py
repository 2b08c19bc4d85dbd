"""A run's identity: digests of the code behind its numbers, stored in every checkpoint.

:func:`run_fingerprint` hashes the configuration, the registered normalisation's
``gains`` (and log-space kernels) and the KL code in use; a resume made with other code
is refused (:func:`check_fingerprint`), so that a resumed run is the same run.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_companion.rl import losses

#: ``run.json`` and config fields that may differ between an interrupted run and its resumption.
RUN_ONLY_FIELDS = ("progress", "device")

#: Config fields added after checkpoints were written, left out of the digest at these
#: defaults (which reproduce the older runs), so that those checkpoints still resume.
LATER_FIELD_DEFAULTS = {"ref_mixup_alpha": 1.0}


def _code_text(code: types.CodeType) -> str:
    """A code object as text without its file name and line numbers (nested code too)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else repr(c)
              for c in code.co_consts]
    return "\n".join([code.co_code.hex(), repr(code.co_names), repr(code.co_varnames),
                      *consts])


def _syntax_text(source: str) -> str:
    """The syntax tree of ``source`` without docstrings, comments, layout or line numbers.

    The raw text where it does not parse on its own (a lambda in the middle of a call
    spread over lines).
    """
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def source_digest(function: Any) -> str:
    """SHA-256 of what a function computes: its source's syntax tree, else its byte code.

    The source is what a person edits; its syntax tree (``_syntax_text``) does not
    change with the line the function starts at, its docstring, comments, layout or
    the Python version. A function without a source file (built by ``exec``) is
    hashed by its byte code and constants. Only the function's own text counts: the
    helpers it calls and the globals it reads are not followed.
    """
    target = function if inspect.isroutine(function) or inspect.isclass(function) else (
        type(function))
    try:
        text = _syntax_text(inspect.getsource(target))
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        text = (_code_text(code) if code is not None else
                f"{target.__module__}.{target.__qualname__}")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _kl_functions(config: Any) -> tuple[Callable[..., Any], ...]:
    """The code of :mod:`losses` that computes the run's KL term (and mixes its two anchors)."""
    if config.exact:
        return (losses.exact_objective, losses.tabular_kl, losses.anchor_penalty)
    if config.grpo.kl == "exact":
        return (losses.tabular_kl, losses.anchor_penalty)
    return (losses.kl_penalty, losses.anchor_penalty)


def run_fingerprint(config: Any, calibration: Any) -> dict[str, str]:
    """What determines a run's numbers besides the seed, as digests (stored in checkpoints).

    ``config``: the configuration (less ``RUN_ONLY_FIELDS``); ``normalization``: the
    source of the registered normalisation's ``gains`` (and of its log-space
    kernels, with its ``uses_eps``/``uses_ddof`` flags), so that a name registered
    again or an edited function is seen; ``kl``: the source of the KL code in use
    (:func:`grpo_companion.rl.losses.kl_penalty`, or the exact KL). Only these pieces are
    hashed, not
    the whole package: an edit elsewhere (the book, plotting, a docstring of another
    module) does not make a checkpoint unusable.
    """
    fields = {k: v for k, v in config.to_dict().items() if k not in RUN_ONLY_FIELDS
              and not (k in LATER_FIELD_DEFAULTS and v == LATER_FIELD_DEFAULTS[k])}
    definition = calibration.definition
    parts = [definition.name, source_digest(definition.gains),
             repr((definition.uses_eps, definition.uses_ddof))]
    if definition.kernels is not None:
        kernels = definition.kernels
        parts += [source_digest(f) for f in (kernels.inverse, kernels.elasticity,
                                             kernels.log_inverse_without_eps)]
        parts.append(repr(kernels.unbounded_without_eps))
    kl = _kl_functions(config)
    return {
        "config": hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest(),
        "normalization": hashlib.sha256("\n".join(parts).encode()).hexdigest(),
        "normalization_name": definition.name,
        "kl": hashlib.sha256("\n".join(source_digest(f) for f in kl).encode()).hexdigest(),
        "kl_code": ", ".join(f"losses.{f.__name__}" for f in kl),
    }


def check_fingerprint(path: Path, saved: Any, current: dict[str, str]) -> None:
    """Refuse a checkpoint made by other code than the run's (``ValueError``, one line)."""
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k), str) for k in current):
        raise ValueError(
            f"cannot resume from {str(path)!r}: it has no fingerprint of the code that made it "
            "(an older version of this trainer wrote it), so a changed normalisation or KL "
            "estimator could not be detected; start the run again in a new folder")
    changed = []
    if saved["config"] != current["config"]:
        changed.append("the configuration")
    if saved["normalization"] != current["normalization"]:
        changed.append(f"the normalisation {current['normalization_name']!r} (its gains "
                       "function was edited or registered again)")
    if saved["kl"] != current["kl"]:
        changed.append(f"the KL estimator code ({current['kl_code']})")
    if changed:
        raise ValueError(
            f"cannot resume from {str(path)!r}: {' and '.join(changed)} changed since the "
            "checkpoint was written, so the resumed run would not be the same run; resume with "
            "the code that wrote it, or start a new run in another folder")

