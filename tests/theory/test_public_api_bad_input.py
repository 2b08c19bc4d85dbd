"""Every public theory function refuses bad input with a ValueError that names the parameter.

The public API is enumerated from ``__all__`` of ``grpo_companion.theory`` and
of each of its public modules (plus the methods of ``Calibration``), so a new
function is covered as soon as it is exported. Each parameter gets a *kind*
from its name (``p_ref`` is a probability, ``beta`` a positive number,
``n_steps`` a count, ...), the project's naming convention; a parameter
whose name is not known here makes :func:`test_every_public_callable_has_a_spec`
fail until a kind is given for it.

For every parameter the test makes calls that are valid except for that one
argument: NaN, ``None``, a string, a boolean, out-of-range values, non-integer
or out-of-range counts, empty or malformed policies, shapes that do not
broadcast, unknown calibration keywords. A call is a *clear error* when it
raises ``ValueError`` whose message names the parameter. Empty arrays for
elementwise parameters must give empty results instead.

Run this file as a script (``python tests/theory/test_public_api_bad_input.py``)
to print the tally of clear errors over bad calls, per function.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_companion.theory as theory
from grpo_companion.theory import Calibration, finite_group

NAN, INF = math.nan, math.inf
HUGE = 10**15

# --------------------------------------------------------------------------- kinds
# A kind: valid value, bad values (label -> value) and how the parameter is used.


@dataclass(frozen=True)
class Kind:
    valid: Any
    bad: dict[str, Any]
    elementwise: bool = False  # broadcast against the other elementwise parameters
    vector: bool = False  # probability vectors (last axis = outcomes)
    optional: bool = False  # None is valid


def _numeric(extra: dict[str, Any]) -> dict[str, Any]:
    return {"nan": NAN, "None": None, "str": "0.5", "bool": True, "object": [0.5, None],
            "complex": 0.5 + 1j, "nan_in_array": [0.3, NAN], **extra}


def _scalar(extra: dict[str, Any]) -> dict[str, Any]:
    return {**_numeric(extra), "array": [0.2, 0.3], "empty": []}


PROB = {"below": -0.25, "above": 1.5, "inf": INF}
PROB_OPEN = {**PROB, "zero": 0.0, "one": 1.0}
BETA = {"zero": 0.0, "negative": -1.0, "inf": INF}
ALPHA = {"negative": -0.5, "above": 1.5}


def _elem(valid: Any, extra: dict[str, Any]) -> Kind:
    return Kind(valid, _numeric(extra), elementwise=True)


def _one(valid: Any, extra: dict[str, Any], optional: bool = False) -> Kind:
    bad = _scalar(extra)
    if optional:
        bad.pop("None")
    return Kind(valid, bad, optional=optional)


def _count(valid: int, minimum: int, *, sizes_memory: bool = False) -> Kind:
    bad = {"nan": NAN, "None": None, "str": str(valid), "bool": True, "float": 2.5,
           "float_integral": float(valid), "below_minimum": minimum - 1, "array": [valid]}
    if sizes_memory:
        bad["huge"] = HUGE
    return Kind(valid, bad)


def _choice(valid: str) -> Kind:
    return Kind(valid, {"None": None, "int": 3, "unknown": "bogus", "bool": True,
                        "list": [valid]})


V3 = [0.2, 0.3, 0.5]
VECTOR_BAD = {"nan": [NAN, 0.5, 0.5], "None": None, "str": "abc", "bool": True,
              "negative": [-0.2, 0.7, 0.5], "unnormalised": [0.2, 0.2, 0.2], "empty": [],
              "scalar": 1.0, "inf": [INF, 0.0, 0.0], "object": [0.2, None, 0.8]}


def _vector(valid: Any = V3, optional: bool = False) -> Kind:
    bad = dict(VECTOR_BAD)
    if optional:
        bad.pop("None")
    return Kind(valid, bad, vector=True, optional=optional)


SEED_BAD = {"negative": -1, "float": 1.5, "str": "0", "bool": True, "huge": 2**70,
            "array": [0, 1]}

KINDS: dict[str, Kind] = {
    # elementwise parameters
    "p": _elem(0.3, PROB), "p_ref": _elem(0.2, PROB), "p0": _elem(0.3, PROB),
    "p_star": _elem(0.6, PROB), "p_nu": _elem(0.3, PROB),
    "logit_p": _elem(0.4, {}), "logit_p_ref": _elem(-1.0, {}), "logit_p0": _elem(0.5, {}),
    "logit_gain": _elem(0.7, {}),
    "beta": _elem(1.0, BETA), "alpha": _elem(1.0, ALPHA),
    "w_plus": _elem(1.0, {"inf": INF}), "w_minus": _elem(0.8, {"inf": INF}),
    "ratio": _elem(1.1, {"negative": -1.0, "inf": INF}),
    # counts
    "n_steps": _count(3, 0, sizes_memory=True), "n_keep": _count(2, 1),
    "n_points": _count(50, 2, sizes_memory=True), "n_transient": _count(5, 0),
    "n_measure": _count(5, 1), "max_period": _count(2, 1), "n_grid": _count(64, 2),
    "n_groups": _count(20, 1), "max_chunk_values": _count(4096, 1),
    "maxiter": _count(100, 1), "n_samples": _count(50, 2, sizes_memory=True),
    "n_prompts": _count(2, 1), "n_outcomes": _count(3, 2),
    "group_size": _count(4, 2, sizes_memory=True),
    # scalars
    "tol": _one(1e-9, {"zero": 0.0, "negative": -1.0, "inf": INF}),
    "gtol": _one(1e-8, {"zero": 0.0, "negative": -1.0, "inf": INF}),
    "saturation_tol": _one(1e-4, {"zero": 0.0, "one": 1.0, "negative": -0.1}),
    "step_fraction": _one(0.5, {"zero": 0.0, "above": 1.5, "inf": INF}),
    "order": _one(0.5, {"zero": 0.0, "one": 1.0, "negative": -0.5}),
    "alpha_two_kl": _one(0.5, {"zero": 0.0, "one": 1.0, "above": 2.0}),
    "eps": _one(1e-5, {"negative": -1.0, "inf": INF, "subnormal": 1e-310}),
    "clip_eps": _one(0.2, {"negative": -0.1}, optional=True),
    # choices and flags
    "normalization": _choice("mean_std"), "eps_placement": _choice("sqrt"),
    "estimator": _choice("k2"),
    "ddof": Kind(0, {"two": 2, "bool": True, "float": 0.5, "str": "1", "None": None}),
    "keep_path": Kind(True, {"int": 1, "str": "yes", "None": None}),
    "seed": Kind(0, {**SEED_BAD, "None": None}),
    "rng": Kind(0, SEED_BAD, optional=True),
    "calibration": Kind(None, {"str": "mean_std", "int": 3, "dict": {"eps": 0.0}},
                        optional=True),
    "stage_length": _count(2, 1), "sync_steps": _count(2, 1),
    "mixup_alpha": _elem(0.6, ALPHA),
    "n_halvings": _count(10, 0), "n_starts": _count(4, 2),
    "radius0": _one(1.0, BETA),
    "fixed_tol": _one(1e-9, {"zero": 0.0, "negative": -1.0, "inf": INF}),
    "x_star": _elem(0.0, {"inf": INF}), "logit_star": _elem(0.0, {"inf": INF}),
    "f": Kind(None, {"None": None, "str": "x", "int": 3}),
    "fprime": Kind(None, {"None": None, "str": "x", "int": 3}),
    "check": Kind(None, {"None": None, "str": "x", "int": 3}),
    # tuples
    "logit_range": Kind((-30.0, 30.0), {"None": None, "scalar": 3.0, "reversed": (5.0, -5.0),
                                        "nan": (NAN, 1.0), "inf": (-INF, 1.0),
                                        "three": (1.0, 2.0, 3.0), "str": "ab"}),
    "bounds": Kind((1e-4, 1.0), {"None": None, "reversed": (1.0, 0.1), "zero": (0.0, 1.0),
                                 "above": (0.1, 2.0), "nan": (NAN, 1.0),
                                 "three": (0.1, 0.2, 0.3), "str": "ab"}),
    "betas": Kind((1.0,), {"None": None, "empty": (), "zero": (0.0,), "nan": (NAN,),
                           "str": "1", "negative": (-1.0,)}),
    # policies and masks (three outcomes, the first a success)
    "policy": _vector(), "prev_policy": _vector([0.3, 0.3, 0.4]),
    "ref_policy": _vector([0.25, 0.25, 0.5]), "pi_ref": _vector([0.25, 0.25, 0.5]),
    "pi_prev": _vector(), "anchor": _vector([0.25, 0.25, 0.5]), "q": _vector([0.4, 0.3, 0.3]),
    "pi_0": _vector(None, optional=True),
    "success_mask": Kind([1, 0, 0], {"None": None, "str": "100", "fraction": [0.5, 0, 1],
                                     "nan": [NAN, 0, 1], "empty": [], "scalar": 1,
                                     "length": [1, 0]}, vector=True),
    "x0": Kind(None, {"nan": [NAN, 0.0, 0.0], "str": "abc", "length": [0.0, 0.0],
                      "inf": [INF, 0.0, 0.0], "bool": True}, optional=True),
    "rewards": Kind([[1.0, 0.0, 0.0, 1.0]], {"nan": [[NAN, 1.0]], "None": None, "str": "x",
                                            "bool": True, "short": [1.0], "scalar": 1.0,
                                            "inf": [[INF, 0.0]], "object": [[1.0, None]]}),
    "success_prob": Kind([[0.2, 0.5], [0.3, 0.55], [0.35, 0.6]],
                         {"nan": [[NAN, 0.5], [0.3, 0.5]], "None": None, "str": "x",
                          "one_row": [[0.2, 0.5]], "flat": [0.2, 0.3], "above": [[0.2, 1.5],
                                                                                [0.3, 0.5]],
                          "bool": True}),
    "gains": Kind(None, {"None": None, "str": "x", "one": (np.ones(3),),
                         "nan": (np.array([NAN, 1.0, 0.0]), np.zeros(3)),
                         "mismatch": (np.ones(3), np.ones(2)),
                         "empty": (np.array([]), np.array([]))}),
}

# Calibration keywords (for functions taking **calibration_kwargs)
CAL_BAD: dict[str, dict[str, Any]] = {
    "eps": {"nan": NAN, "None": None, "str": "1e-5", "bool": True, "negative": -1.0,
            "inf": INF, "subnormal": 1e-310, "array": [1e-5, 1e-4]},
    "normalization": {"unknown": "bogus", "None": None, "int": 3, "list": ["mean_std"]},
    "eps_placement": {"unknown": "bogus", "None": None},
    "group_size": {"one": 1, "float": 2.5, "bool": True, "str": "4", "huge": HUGE},
    "ddof": {"two": 2, "bool": True, "float": 0.5},
    "epsilon": {"unknown_keyword": 1e-5},
}

# Per-function overrides: (kind changes, valid values)
SCALAR_P = _one(0.3, PROB)
OVERRIDES: dict[str, dict[str, Kind]] = {
    "cobweb_path": {"p0": _one(0.3, PROB), "p_ref": _one(0.2, PROB), "beta": _one(1.0, BETA),
                    "alpha": _one(1.0, ALPHA)},
    "maximise_regularised_objective": {"beta": _one(1.0, BETA), "alpha": _one(1.0, ALPHA),
                                       "p_nu": _one(None, PROB, optional=True)},
    "regularised_objective": {"beta": _one(1.0, BETA), "alpha": _one(1.0, ALPHA),
                              "p_nu": _one(None, PROB, optional=True)},
    "relaxed_iterate": {"beta": _one(1.0, BETA), "alpha": _one(1.0, ALPHA)},
    "fit_step_fraction": {"beta": _one(1.0, BETA), "alpha": _one(1.0, ALPHA)},
    "pos_map_derivative": {"p": _elem(0.3, PROB_OPEN)},
    "Calibration.omega_prime": {"p": _elem(0.3, PROB_OPEN)},
    "estimate_group_weights": {"p": _elem(0.3, PROB_OPEN), "n_groups": _count(20, 2)},
    "scan_fixed_points": {"p_ref": _elem(0.2, PROB_OPEN)},
    "regime_map": {"p0": Kind(None, {k: v for k, v in _numeric(PROB).items() if k != "None"},
                              elementwise=True, optional=True)},
    "expected_kl_gradient": {"prev_policy": _vector(None, optional=True)},
    "kl_divergence": {"p": _vector([0.2, 0.3, 0.5])},
    "renyi_divergence": {"p": _vector([0.2, 0.3, 0.5])},
    "reverse_kl_policy": {"advantage": Kind([1.0, -0.5, -0.5], {"nan": [NAN, 0.0, 0.0],
                                                              "None": None, "str": "x",
                                                              "bool": True,
                                                              "inf": [INF, 0.0, 0.0],
                                                              "length": [1.0, 0.0]})},
    # analyses.surrogate's per-sample objective (analyses.clipped's one is "clipped_objective")
    "surrogate.clipped_objective": {"advantage": _elem(0.5, {"inf": INF}),
                          "clip_eps": _one(0.2, {"negative": -0.1}, optional=True)},
    "group_advantages": {"eps": _one(1e-5, {"negative": -1.0, "inf": INF})},
    "sample_groups": {"n_groups": _count(3, 1, sizes_memory=True)},
    "check_table1": {"n_steps": _count(2, 1), "n_grid": _count(2, 2)},
    "orbit_tail": {"n_steps": _count(4, 1)},
    "policy_iterate": {"n_steps": _count(2, 0)},
    "variants": {},
    "Anchor": {"pairs": Kind(((0.5, "reference"), (0.5, "prev")),
                             {**_numeric(ALPHA), "target": ((1.0, "elsewhere"),),
                              "sum": ((0.4, "reference"),), "negative_weight":
                              ((-0.5, "reference"), (1.5, "prev")), "empty": ()})},
    "group_gains": {"eps": _one(1e-5, {"negative": -1.0, "inf": INF, "subnormal": 1e-310})},
    "Calibration": {"group_size": Kind(None, {k: v for k, v in _count(4, 2, sizes_memory=True)
                                              .bad.items() if k != "None"}, optional=True),
                    # the bound registration (a Normalization) or None for the registry's
                    "definition": Kind(None, {"str": "mean_std", "int": 3, "bool": True,
                                              "function": lambda s, f, n, cal, ops: (f, s)},
                                       optional=True)},
    "weights": {"group_size": Kind(None, {k: v for k, v in _count(4, 2, sizes_memory=True)
                                          .bad.items() if k != "None"}, optional=True)},
    "local_contraction": {"n_samples": _count(17, 3), "n_steps": _count(20, 1)},
    "max_lemma1_bound": {"calibration": Kind(Calibration(), {"None": None, "str": "x",
                                                            "int": 3})},
    "group_table": {"calibration": Kind(Calibration(), {"None": None, "str": "x", "int": 3}),
                    "group_size": _count(4, 2, sizes_memory=True)},
}
EXTRA_VALID: dict[str, dict[str, Any]] = {
    "estimate_group_weights": {"group_size": 4},
    "group_weights_of_logit": {"gains": finite_group.group_gains(4, "mean_std", 1e-5,
                                                                        "sqrt", 0)},
    "group_weights_prime_of_logit": {"gains": finite_group.group_gains(4, "mean_std", 1e-5,
                                                                              "sqrt", 0)},
    "period_two_orbits": {"beta": 0.05}, "period_two_orbits_logit": {"beta": 0.05},
    "check_table1": {"n_prompts": 2, "n_outcomes": 3},
    "local_contraction": {"f": lambda x: 0.5 * x, "fprime": lambda x: 0.5 + 0.0 * x},
    "reference_map_contraction": {
        "logit_star": float(theory.fixed_points_logit(-1.0, 1.0)[0]), "logit_p_ref": -1.0},
}


def _a_contraction_check() -> Any:
    from grpo_companion.theory.analyses import contraction
    return contraction.local_contraction(lambda x: 0.5 * x, lambda x: 0.5 + 0.0 * x, [0.0],
                                         n_steps=5)


EXTRA_VALID["uniform_contraction"] = {"check": _a_contraction_check()}
# Data containers, enums and constants: built by the library, not called with user input.
NOT_CALLABLE_WITH_INPUT = {
    "DynamicsResult", "Regime", "Label", "LABEL_NAMES", "RegimeMap", "EPS_PLACEMENTS",
    "NORMALIZATIONS", "GroupWeightEstimate", "ESTIMATOR_TARGETS", "KL_ESTIMATORS", "KLEstimator",
    "NumericalOptimum",
    "ContrastiveTerms", "MonteCarloEstimate", "RowCheck", "Variant", "ContractionCheck",
    "StagedPath", "CALIBRATIONS", "ANCHOR_KINDS", "NUMPY_OPS", "Ops", "LogKernels",
    "Normalization", "Table1Row", "ANCHOR_TARGETS",
}
# The anchor's mixing helpers take numbers, arrays, tensors or SymPy expressions alike and
# leave the checks to their callers; tests/variants/test_anchor.py checks them.
NOT_CALLABLE_WITH_INPUT |= {"share_pairs", "mix_targets"}
# The registry's functions change global state; tests/theory/test_variants.py checks their
# refusals (a taken name, a failing, negative, infinite or batch-level gains function).
REGISTRY = {"register_normalization", "unregister_normalization", "sympy_ops",
            "calibration_named"}
# tests/variants/test_kl_registry.py checks the KL estimator registry's refusals
REGISTRY |= {"register_kl_estimator", "unregister_kl_estimator"}
NOT_CALLABLE_WITH_INPUT |= {"kl_estimator_help"}  # no parameters
OVERRIDES["kl_estimator_names"] = {"exact": Kind(False, {"int": 1, "str": "yes", "None": None})}
# --- chapter modules theory.analyses.parametric (ch. 9), theory.analyses.beta_sweep (ch. 5)
def _parametric_fixtures() -> dict[str, Any]:
    from grpo_companion.theory.analyses import parametric

    ref_probs = np.array([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]])
    success = np.array([[True, False, False], [False, True, False]])
    ref_log = np.log(ref_probs)
    phi = parametric.tabular_features(2, 3)
    policy = parametric.LogLinearPolicy(ref_log, phi)
    run = parametric.parametric_grpo(policy, success, 1.0, 2)
    exact = parametric.exact_iterates(ref_probs, success, 1.0, 2)
    return {"ref_probs": ref_probs, "success": success, "ref_log": ref_log, "phi": phi,
            "policy": policy, "run": run, "exact": exact}


_PF = _parametric_fixtures()
_TRAJ = [[0.2, 0.5], [0.3, 0.55], [0.35, 0.6]]
_POLICY_KIND = Kind(_PF["policy"], {"None": None, "str": "x", "array": [0.2, 0.3, 0.5]})
KINDS.update({
    "success": Kind(_PF["success"], {"None": None, "str": "x", "fraction": [[0.5, 0, 1], [0, 1, 0]],
                                     "nan": [[NAN, 0, 1], [0, 1, 0]], "flat": [1, 0, 0],
                                     "all_success": [[1, 1, 1], [0, 1, 0]], "empty": [],
                                     "scalar": 1}),
    "ref_log_probs": Kind(_PF["ref_log"], {"None": None, "str": "x", "nan": [[NAN, 0.0, 0.0]] * 2,
                                           "unnormalised": _PF["ref_log"] + 1.0,
                                           "flat": [-1.0, -1.0], "inf": [[INF, 0.0, 0.0]] * 2}),
    "features": Kind(_PF["phi"], {"None": None, "str": "x", "nan": np.full((2, 3, 1), NAN),
                                  "shape": np.zeros((2, 2, 1)), "flat": [0.0, 1.0]}),
    "theta": Kind(np.zeros(6), {"None": None, "str": "x", "nan": np.full(6, NAN), "short": [0.0],
                                "inf": np.full(6, INF)}),
    "p_prev": Kind([0.3, 0.6], {"None": None, "str": "x", "nan": [NAN, 0.5],
                                "above": [0.3, 1.5], "length": [0.3]}),
    "n_outputs": _count(3, 1),
    "dim": Kind(2, {"None": None, "str": "2", "bool": True, "float": 2.5, "zero": 0, "above": 7,
                    "array": [2]}),
    "groups": Kind(1, {"None": None, "str": "1", "zero": 0, "above": 3, "float": 1.5,
                       "negative_label": [-1, 0], "length": [0]}),
    "accept_gtol": _one(1e-8, {"zero": 0.0, "negative": -1.0, "inf": INF}),
    "max_iter": _count(100, 1),
    "ref_probs": Kind(_PF["ref_probs"], {"None": None, "str": "x", "nan": [[NAN, 0.5, 0.5]] * 2,
                                         "unnormalised": [[0.2, 0.2, 0.2]] * 2,
                                         "negative": [[-0.2, 0.7, 0.5]] * 2}),
    "tv": Kind([0.0, 0.2, 0.1], {"None": None, "str": "x", "nan": [0.0, NAN],
                                 "negative": [0.0, -0.1], "above": [0.0, 1.5], "scalar": 0.5,
                                 "empty": []}),
    "param_probs": Kind(_PF["run"].probs, {"None": None, "str": "x",
                                           "shape": np.full((3, 2, 2), 0.5),
                                           "unnormalised": np.full((3, 2, 3), 0.2),
                                           "nan": np.full((3, 2, 3), NAN)}),
    "exact_probs": Kind(_PF["exact"], {"None": None, "str": "x", "shape": np.full((3, 2, 2), 0.5),
                                       "unnormalised": np.full((3, 2, 3), 0.2),
                                       "nan": np.full((3, 2, 3), NAN)}),
    "run": Kind(_PF["run"], {"None": None, "str": "x", "int": 3}),
    "prompts": Kind([0], {"None": None, "str": "0", "bool": True, "float": [0.5],
                          "out_of_range": [5], "duplicate": [0, 0], "empty": [],
                          "negative": [-1]}),
    "predicted": Kind(_TRAJ, {"None": None, "str": "x", "nan": [[NAN, 0.5]] * 3,
                              "shape": [[0.2, 0.5]], "bool": True}),
    "observed": Kind(_TRAJ, {"None": None, "str": "x", "nan": [[NAN, 0.5]] * 3,
                             "shape": [[0.2, 0.5]], "bool": True}),
    "eval_samples": _count(50, 1),
    "n_se": _one(3.0, {"zero": 0.0, "negative": -1.0, "inf": INF}),
})
OVERRIDES.update({
    "total_variation": {"p": _vector([0.2, 0.3, 0.5])},
    "grpo_objective": {"policy": _POLICY_KIND},
    "projection_error": {"policy": _POLICY_KIND},
    "parametric_grpo": {"policy": _POLICY_KIND},
    "measure_gap": {"policy": _POLICY_KIND},
    "split_prompts": {"n_prompts": _count(4, 2)},
    "sweep_beta": {"p_ref": _one(0.2, PROB_OPEN), "alpha": _one(1.0, ALPHA)},
    "error_decomposition": {"beta": _one(1.0, BETA)},
})
EXTRA_VALID.update({
    "grpo_objective": {"theta": np.zeros(6)},
    "projection_error": {"theta": np.zeros(6)},
    "random_features": {"n_prompts": 2, "n_outputs": 3},
    "correctness_features": {"success": _PF["success"]},
    "error_decomposition": {"exact_probs": _PF["exact"]},
})
NOT_CALLABLE_WITH_INPUT |= {"ParametricRun", "GapReport", "ErrorDecomposition", "GapMeasurement",
                            "BetaSweep", "Verdict", "PROMPT_BLIND", "STEPS"}

# --- theory.audit (ch. 10): the fixed-point census of any calibration
NOT_CALLABLE_WITH_INPUT |= {"CalibrationAudit"}
OVERRIDES["audit_calibration"] = {
    "calibration": Kind(Calibration(), {"None": None, "str": "x", "int": 3}),
    "n_grid": _count(6, 2),
    "p_ref_bounds": Kind((1e-3, 1 - 1e-3), {"None": None, "scalar": 0.5, "reversed": (0.9, 0.1),
                                            "zero": (0.0, 0.5), "one": (0.5, 1.0),
                                            "nan": (NAN, 0.5), "three": (0.1, 0.2, 0.3),
                                            "str": "ab"}),
    "beta_bounds": Kind((0.1, 10.0), {"None": None, "scalar": 1.0, "reversed": (10.0, 0.1),
                                      "zero": (0.0, 1.0), "inf": (0.1, INF), "nan": (NAN, 1.0),
                                      "three": (0.1, 1.0, 10.0), "str": "ab"}),
}

# --- theory.analyses.trained_loss (ch. 8): the recurrence of the loss a sampled run trains.
# Trajectories are (len(steps), prompts) logits; one_step_tv's arrays are coupled by
# shape (prompts, outputs), so they are whole-array kinds, not elementwise ones.
_LOGIT_TRAJ = [[-1.0, 0.5], [-0.8, 0.7], [-0.6, 0.9]]
_LOGIT_TRAJ_BAD = {"None": None, "str": "x", "nan": [[NAN, 0.5]] * 3, "flat": [0.1, 0.2],
                   "bool": True, "object": [[0.1, None]] * 3, "complex": [[0.5 + 1j, 0.1]] * 3}
_LOG_PI = np.log([[0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])
KINDS.update({
    "logit_success": Kind(_LOGIT_TRAJ, {**_LOGIT_TRAJ_BAD, "one_row": [[-1.0, 0.5]],
                                        "no_prompts": np.zeros((3, 0))}),
    "steps": Kind([0, 1, 2], {"None": None, "str": "012", "bool": True, "float": [0.0, 1.0, 2.0],
                              "not_from_zero": [1, 2, 3], "decreasing": [0, 2, 1],
                              "repeated": [0, 1, 1], "length": [0, 1], "nan": [0, NAN, 2],
                              "nested": [[0, 1, 2]]}),
    "log_probs": Kind(_LOG_PI, {"None": None, "str": "x", "nan": [[NAN, 0.0, 0.0]] * 2,
                                "positive": _LOG_PI + 1.0, "inf": [[INF, 0.0, 0.0]] * 2,
                                "flat": [-1.0, -1.0], "outputs": _LOG_PI[:, :2],
                                "prompts": _LOG_PI[:1], "one_output": np.zeros((2, 1)),
                                "bool": True}),
    "correct": Kind([0, 1], {"None": None, "str": "01", "bool": True, "float": [0.0, 1.0],
                             "out_of_range": [0, 3], "negative": [-1, 0], "length": [0],
                             "scalar": 0, "nested": [[0, 1]], "mask": [True, False]}),
    "shift": Kind([0.0, 0.2, 0.4], {"None": None, "str": "x", "bool": True, "nan": [0.0, NAN, 0.1],
                                    "short": [0.0, 0.1], "object": [0.0, None, 0.1],
                                    "complex": [0.0, 1j, 0.1]}),
    "logit_target": Kind([0.3, -0.2], {"None": None, "str": "x", "bool": True,
                                       "nan": [0.3, NAN], "short": [0.3], "scalar": 0.3,
                                       "object": [0.3, None], "complex": [0.3 + 1j, 0.0]}),
})
# beta of a trajectory: a number or one per prompt (two prompts in _LOGIT_TRAJ)
_PER_PROMPT_BETA = Kind(1.0, _numeric({**BETA, "shape": [0.2, 0.3, 0.4]}))
_GROUPS_BAD = {"str": "01", "bool": [True, False], "float": [0.0, 1.0], "length": [0],
               "scalar": 0, "nested": [[0, 1]]}
KINDS.update({
    "step": _choice("round"),
    "first_signal": _elem(3, {"zero": 0, "fraction": 1.5, "inf": INF}),
    "fit_logit_success": Kind(_LOGIT_TRAJ, {**_LOGIT_TRAJ_BAD, "one_row": [[-1.0, 0.5]],
                                            "no_prompts": np.zeros((3, 0))}),
    "group": Kind(None, _GROUPS_BAD, optional=True),
    "fit_group": Kind(None, _GROUPS_BAD, optional=True),
    "level": _one(2.0, {"inf": INF}),
    "rate": _one(0.1, {"negative": -0.1, "above": 1.5}),
    "fit_beta": Kind(1.0, _numeric({**BETA, "shape": [0.2, 0.3, 0.4]})),
    "predictions": Kind({"x": _LOGIT_TRAJ, "a": np.zeros((3, 2))},
                        {"None": None, "empty": {}, "list": [_LOGIT_TRAJ],
                         "shape": {"x": _LOGIT_TRAJ, "a": np.zeros((2, 2))},
                         "nan": {"x": _LOGIT_TRAJ, "a": np.full((3, 2), NAN)}}),
    "predictor": Kind("x", {"None": None, "unknown": "nope", "int": 3}),
    "baselines": Kind(("a",), {"None": None, "empty": (), "unknown": ("nope",),
                               "predictor": ("x",), "str": "a", "list": ["a"]}),
})
OVERRIDES.update({
    "trained_loss.fit_step_fraction": {"beta": _PER_PROMPT_BETA},
    "relaxation_path_logit": {"steps": Kind([0, 1, 2], {
        k: v for k, v in KINDS["steps"].bad.items() if k != "length"})},
    "kernel_reference": {"beta": _PER_PROMPT_BETA, "logit_p_ref": Kind(
        [-1.0, 0.5], _numeric({"inf": INF, "scalar": 0.5, "nested": [[-1.0, 0.5]]}))},
    "judge": {"margin": _one(0.8, {"zero": 0.0, "negative": -1.0, "inf": INF,
                                   "array": [0.8, 0.9]})},
    # one row is a valid table of shifts (all zero)
    "common_shift": {"logit_success": Kind(_LOGIT_TRAJ, {**_LOGIT_TRAJ_BAD,
                                                         "no_prompts": np.zeros((3, 0)),
                                                         "three_d": np.zeros((3, 2, 1))})},
    "mean_trajectory": {"logit_success": Kind(_LOGIT_TRAJ, {**_LOGIT_TRAJ_BAD,
                                                            "no_prompts": np.zeros((3, 0)),
                                                            "three_d": np.zeros((3, 2, 1))})},
})


# --- issue 24: theory.analyses.clipped, clip_bias, entropy and sample_weighting
_LOGITS_BAD = {"nan": [NAN, 0.0, 0.0], "None": None, "str": "abc", "bool": True,
               "inf": [INF, 0.0, 0.0], "scalar": 1.0, "empty": [], "object": [0.1, None, 0.3],
               "complex": [0.1 + 1j, 0.0, 0.0]}
_POINTS_BAD = {"nan": [0.5, NAN, 0.3, 0.2], "None": None, "str": "abc", "bool": True,
               "inf": [0.5, INF, 0.3, 0.2], "object": [0.5, None, 0.3, 0.2],
               "complex": [0.5 + 1j, 0.4, 0.3, 0.2], "length": [0.5, 0.4, 0.3]}
# clipped: k in (0, 1] and k_high in (0, inf], both broadcast with the other numbers
_CLIP_K = _elem(0.2, {"zero": 0.0, "negative": -0.1, "above": 1.5, "inf": INF})
_TRAIN_MASK = KINDS["success_mask"].bad
KINDS.update({
    "pi": _vector(),
    "clip_eps_high": Kind(None, {k: v for k, v in _numeric({"zero": 0.0, "negative": -0.1})
                                 .items() if k != "None"}, optional=True),
    "lr": _one(0.5, {"negative": -1.0, "inf": INF}),
    "logits": Kind([0.1, -0.2, 0.3], {**_LOGITS_BAD, "all_minus_inf": [-INF, -INF, -INF]}),
    "dz": Kind([0.01, -0.02, 0.03], dict(_LOGITS_BAD)),
    "gradient": _choice("plain"),
    "entropy": Kind([0.9, 0.7, 0.4, 0.2], {**_POINTS_BAD, "short": [0.9, 0.7],
                                           "constant": [0.5, 0.5, 0.5, 0.5], "scalar": 0.5}),
    "reward": Kind([0.2, 0.3, 0.45, 0.6], dict(_POINTS_BAD)),
    "outputs": Kind([0, 1, 2, 0], {"None": None, "str": "0", "bool": [True, False, True, False],
                                   "float": [0.0, 1.0, 2.0, 0.0], "negative": [-1, 0, 1, 2],
                                   "out_of_range": [0, 1, 3, 0], "scalar": 0, "empty": [],
                                   "length": [0, 1, 2]}),
    "advantages": Kind([1.0, -1.0, 0.5, -0.5], {**_POINTS_BAD, "length": [1.0, -1.0, 0.5]}),
    "variant": Kind("grpo", {"unknown": "bogus", "None": None, "int": 3, "bool": True,
                             "three": (1.0, 1.0, 1.0), "one": (1.0,)}),
    "n_rounds": _count(2, 0), "mu": _count(1, 1),
    "unlikeliness": _elem(0.5, {"negative": -0.5, "inf": INF}),
    "k": _elem(4.0, {"negative": -1.0, "inf": INF}),
    "z": Kind([0.1, -0.2, 0.3], {k: v for k, v in _LOGITS_BAD.items()
                                 if k not in ("scalar", "empty")}),
    "advantage": Kind([1.0, -0.5, -0.5], {"nan": [NAN, 0.0, 0.0], "None": None, "str": "x",
                                          "bool": True, "inf": [INF, 0.0, 0.0],
                                          "length": [1.0, 0.0]}),
    "pair": Kind(None, {"one": (0,), "three": (0, 1, 2), "out_of_range": (0, 5),
                        "float": (0.5, 1), "failure": (0, 2), "same": (0, 0),
                        "negative": (-1, 0)}, optional=True),
})
_ENTROPY_STEP = {"lr": _elem(0.5, {"zero": 0.0, "negative": -1.0, "inf": INF})}
_STEP_LOGITS = Kind([0.1, -0.2, 0.3], {**_LOGITS_BAD, "minus_inf": [-INF, 0.0, 0.0]})
_GROUP_LOGITS = Kind([0.1, -0.2, 0.3], {**_LOGITS_BAD, "length": [0.0, 0.0]})
_SCALAR_P_HALF = _one(0.5, PROB)
OVERRIDES.update({
    # theory.analyses.clipped
    "clipped_surrogate": {"clip_eps": _CLIP_K, "advantage": _elem(0.5, {"inf": INF})},
    "clipped_objective": {"clip_eps": _CLIP_K, "pi_prev": _vector([0.3, 0.3, 0.4])},
    "clipped_round_policy": {"clip_eps": _CLIP_K, "pi_prev": _vector([0.3, 0.3, 0.4])},
    "clipped_pos_map": {"clip_eps": _CLIP_K},
    "clipped_pos_map_logit": {"clip_eps": _CLIP_K},
    # n_steps rounds of a closed-form map: no memory to size, so no "huge" count
    "clipped_iterate_logit": {"clip_eps": _CLIP_K, "n_steps": _count(3, 0)},
    "clipped_fixed_points": {"clip_eps": _CLIP_K},
    "clipped_fixed_points_logit": {"clip_eps": _CLIP_K},
    # theory.analyses.clip_bias
    "enumerate_groups": {"p": _SCALAR_P_HALF},
    "expected_drift": {"p": _SCALAR_P_HALF},
    "group_surrogate": {"logits": _GROUP_LOGITS},
    "group_surrogate_gradient": {"logits": _GROUP_LOGITS},
    # theory.analyses.entropy
    "grpo_logit_step": {**_ENTROPY_STEP, "logits": _STEP_LOGITS},
    "step_entropy_covariance": {**_ENTROPY_STEP, "logits": _STEP_LOGITS},
    "exact_gradient_run": dict(_ENTROPY_STEP),
    "compare_entropy_laws": {
        "entropy": Kind([[0.9, 0.7, 0.4, 0.2], [1.0, 0.6, 0.5, 0.1]],
                        {k: [v, v] if isinstance(v, list) else v
                         for k, v in KINDS["entropy"].bad.items()}),
        "reward": Kind([[0.2, 0.3, 0.45, 0.6], [0.1, 0.35, 0.4, 0.7]],
                       {k: [v, v] if isinstance(v, list) else v
                        for k, v in KINDS["reward"].bad.items()})},
    # theory.analyses.sample_weighting
    "log_ratio_drift": {"a": Kind(0, {**_count(0, 0).bad, "above": 3}),
                        "b": Kind(1, {**_count(1, 0).bad, "above": 3})},
    "softmax_objective": {"beta": _elem(1.0, {"negative": -1.0, "inf": INF})},
    "softmax_gradient": {"beta": _elem(1.0, {"negative": -1.0, "inf": INF})},
    "weighted_fixed_points_logit": {"logit_p_ref": _one(-1.0, {}), "beta": _one(1.0, BETA)},
    # one 1-D policy with two correct outputs of unequal reference probability
    "expected_gradient_training": {
        "pi_ref": _vector([0.5, 0.3, 0.2]),
        "success_mask": Kind([1, 1, 0], dict(_TRAIN_MASK), vector=True),
        "beta": _one(1.0, {"negative": -1.0, "inf": INF}),
        "lr": _one(0.25, {"zero": 0.0, "negative": -1.0, "inf": INF}),
        "unlikeliness": _one(0.0, {"negative": -0.5, "inf": INF})},
})
NOT_CALLABLE_WITH_INPUT |= {"ClipDrift", "EnumeratedGroups", "EntropyRun", "EntropyLawFit",
                            "EntropyLawComparison", "GRADIENTS", "VARIANT_SCALES",
                            "TrainingPath", "SampledClipDrift", "SampledTrainingPath",
                            "SAMPLE_VARIANTS"}
# gains functions of the registry (they also run on SymPy symbols, so they cannot check their
# inputs), and the call that registers them (global state; tested in test_sample_weighting)
REGISTRY |= {"positive_only_gains", "negative_only_gains", "w_reinforce_gains",
             "register_sample_variants"}
_TRAINING_SPECS = OVERRIDES["expected_gradient_training"]
OVERRIDES.update({
    # sampled counterparts (issue 24, items 3 and 6)
    "sampled_drift": {"p": _SCALAR_P_HALF, "lr": _one(0.5, {"negative": -1.0, "inf": INF}),
                      "n_samples": _count(50, 2, sizes_memory=True),
                      "seed": Kind(0, {**SEED_BAD, "None": None})},
    "sampled_gradient_training": {
        **_TRAINING_SPECS,
        "unlikeliness": _one(0.0, {"negative": -0.5, "above": 1.5, "inf": INF}),
        "n_rounds": _count(2, 0, sizes_memory=True),
        "n_seeds": _count(4, 1, sizes_memory=True),
        "group_size": _count(4, 2, sizes_memory=True),
        "z0": Kind(None, {"nan": [0.0, NAN, 0.0], "inf": [0.0, INF, 0.0], "length": [0.0, 0.0],
                          "str": "abc"}, optional=True),
        "seed": Kind(0, {**SEED_BAD, "None": None})},
    # chapter 7's clipped mu-step Adam run, in expectation (issue 24, item 1)
    "expected_clipped_training": {
        "clip_eps": _CLIP_K, "n_iterations": _count(3, 0),
        "lr": _one(0.1, {"zero": 0.0, "negative": -1.0, "inf": INF}),
        "adam_betas": Kind((0.9, 0.999), {"None": None, "one": (0.9,), "above": (1.0, 0.999),
                                          "negative": (-0.1, 0.999), "nan": (NAN, 0.999),
                                          "str": "ab"}),
        "adam_eps": _one(1e-8, {"negative": -1.0, "inf": INF})},
})

# --- issue 22, item 4: chapter 14's pass@k, crossover and settling rounds, and the statistics
# over seeds of chapters 7 and 14 (theory.analyses.sample_weighting, clipped, seed_statistics)
_SEEDS_BAD = {"nan": [[0.1, NAN], [0.2, 0.3]], "None": None, "str": "x", "bool": True,
              "inf": [[0.1, INF], [0.2, 0.3]], "object": [[0.1, None], [0.2, 0.3]],
              "one_seed": [[0.1, 0.2]], "scalar": 0.5}
_SEEDS = Kind([[0.1, 0.2], [0.3, 0.5]], _SEEDS_BAD)
_BEFORE = Kind([[0.0, 0.1], [0.2, 0.3]], {**{k: v for k, v in _SEEDS_BAD.items()
                                             if k != "one_seed"}, "shape": [[0.1]]})
_AXIS = Kind(0, {"float": 0.5, "str": "0", "bool": True, "out_of_range": 2,
                 "below_range": -3})  # None: every entry pooled
_CURVES = [[0.1, 0.2, 0.3], [0.1, 0.25, 0.3]]
_CURVES_BAD = {"nan": [[0.1, NAN, 0.3]] * 2, "None": None, "str": "x", "bool": True,
               "inf": [[0.1, INF, 0.3]] * 2, "one_seed": [[0.1, 0.2, 0.3]],
               "length": [[0.1, 0.2]] * 2, "scalar": 0.5}
OVERRIDES.update({
    "mean_and_standard_error": {"values": _SEEDS, "axis": _AXIS},
    "t_statistic": {"values": _SEEDS, "axis": _AXIS},
    "paired_difference": {"after": _SEEDS, "before": _BEFORE, "axis": _AXIS},
    "t_p_value": {"t": _elem(2.0, {}), "n_seeds": _count(3, 2)},
    "mean_pass_at_k_of_logit": {
        "logit_p": Kind([[0.1, -0.2, 0.3]], {"nan": [[0.1, NAN]], "None": None, "str": "x",
                                             "bool": True, "object": [[0.1, None]],
                                             "complex": [[0.1 + 1j]], "scalar": 0.3,
                                             "no_prompts": np.zeros((2, 0))}),
        "k": Kind([1.0, 4.0], {"nan": [1.0, NAN], "negative": [-1.0], "inf": [INF],
                               "None": None, "str": "4", "bool": True})},
    "pass_at_k_crossover": {
        "before": Kind(_CURVES, {k: v for k, v in _CURVES_BAD.items() if k != "one_seed"}),
        "after": Kind([[0.2, 0.2, 0.3], [0.3, 0.2, 0.35]], dict(_CURVES_BAD)),
        "k": Kind([1.0, 2.0, 4.0], {"nan": [1.0, NAN, 4.0], "negative": [-1.0, 2.0, 4.0],
                                    "decreasing": [4.0, 2.0, 1.0], "short": [1.0],
                                    "None": None, "str": "124", "scalar": 2.0}),
        "n_se": _one(3.0, {"negative": -1.0, "inf": INF})},
    "rounds_to_settle": {
        "path": Kind([0.3, 0.2, 0.25, 0.25], {"nan": [0.3, NAN], "None": None, "str": "x",
                                              "bool": True, "empty": [], "two_d": [[0.1, 0.2]],
                                              "inf_end": [0.1, INF], "object": [0.1, None]})},
    # chapter 8's predictions (theory.analyses.trained_loss)
    "predictor_paths": {
        "beta": _PER_PROMPT_BETA,
        "recurrences": Kind({"r": ("k3", "divergence", 0.3)},
                            {"None": None, "empty": {}, "list": [("k3", "divergence", 0.3)],
                             "baseline_name": {"no change": ("k3", "divergence", 0.3)},
                             "two": {"r": ("k3", 0.3)}, "str": "r"})},
    # the chapters' error in chosen units (theory.analyses.numerical; ch. 1, 5, 10)
    # (a reduction to one float: its arrays broadcast but are not elementwise)
    "max_scaled_error": {"value": Kind(1.0, _numeric({})), "reference": Kind(0.5, _numeric({})),
                         "scale": Kind(0.1, _numeric({"zero": 0.0, "negative": -1.0}))},
    # chapter 8's jump of the forward-KL destination (theory.analyses.trained_loss)
    "destination_crossing": {
        "level": _one(0.5, {"zero": 0.0, "one": 1.0, "negative": -0.5}),
        "beta": _one(0.1, BETA),
        "log10_bracket": Kind((-15.0, -3.0), {"None": None, "reversed": (-3.0, -15.0),
                                              "nan": (NAN, -3.0), "str": "ab",
                                              "three": (-15.0, -9.0, -3.0),
                                              "no_crossing": (-3.0, -1.0)}),
        "xtol": _one(1e-9, {"zero": 0.0, "negative": -1.0, "inf": INF})},
    # chapter 5's Remark 2 threshold (theory.analyses.beta_sweep)
    "stable_from": {"stable": Kind([True], {"None": None, "int": [1], "str": "T",
                                            "length": [True, False], "scalar": True})},
})
NOT_CALLABLE_WITH_INPUT |= {"PairedDifference", "PassAtKCrossover"}

# Result fields that do not depend on the batch of inputs (not empty for an empty batch).
BATCH_FREE_FIELDS = {"staged_iterate": {"stage"}, "moving_reference_iterate": {"stage"}}
CALIBRATION_METHODS = ("weights", "weights_of_logit", "log_weights_of_logit", "omega",
                       "omega_of_logit", "omega_prime", "omega_prime_of_logit")


# ---------------------------------------------------------------------- the API
def public_callables() -> dict[str, Callable[..., Any]]:
    """Every exported callable of the theory package, keyed by a unique name."""
    # walk_packages: the core modules and those of the subpackage theory.analyses
    modules = [theory] + [importlib.import_module(m.name)
                          for m in pkgutil.walk_packages(theory.__path__, "grpo_companion.theory.")
                          if not any(p.startswith("_") for p in m.name.split("."))]
    out: dict[str, Callable[..., Any]] = {}
    seen: set[int] = set()
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if name in NOT_CALLABLE_WITH_INPUT or name in REGISTRY or id(obj) in seen:
                continue
            seen.add(id(obj))
            # two modules may export one name (relaxed and trained_loss: fit_step_fraction);
            # the later one is keyed by its module, so that neither hides the other
            key = name if name not in out else f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
            out[key] = obj
    cal = Calibration()
    for method in CALIBRATION_METHODS:
        if hasattr(cal, method):
            out[f"Calibration.{method}"] = getattr(cal, method)
    return out


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(func)


def kinds_of(name: str, func: Callable[..., Any]) -> dict[str, Kind]:
    """Kind of every named parameter of ``func`` (KeyError for an unknown name)."""
    out = {}
    for param in _signature(func).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            continue
        out[param.name] = OVERRIDES.get(name, {}).get(param.name) or KINDS[param.name]
    return out


def takes_calibration_keywords(func: Callable[..., Any]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in _signature(func).parameters.values())


def valid_call(name: str, func: Callable[..., Any]) -> dict[str, Any]:
    kwargs = {param: kind.valid for param, kind in kinds_of(name, func).items()}
    for param, value in EXTRA_VALID.get(name, {}).items():
        kwargs[param] = value
    return kwargs


@dataclass(frozen=True)
class BadCall:
    function: str
    parameter: str
    label: str
    kwargs: dict[str, Any]
    names: tuple[str, ...]  # an acceptable message names one of these


def bad_calls(name: str, func: Callable[..., Any]) -> list[BadCall]:
    """Every bad call of ``func``: one wrong argument, the others valid."""
    base = valid_call(name, func)
    kinds = kinds_of(name, func)
    out = []
    for param, kind in kinds.items():
        for label, value in kind.bad.items():
            out.append(BadCall(name, param, label, {**base, param: value}, (param,)))
    elementwise = [p for p, k in kinds.items() if k.elementwise]
    for first, second in zip(elementwise, elementwise[1:], strict=False):
        a, b = (0.3 if base[k] is None else base[k] for k in (first, second))  # p0=None
        out.append(BadCall(name, f"{first}+{second}", "shapes",
                           {**base, first: np.full(2, a), second: np.full(3, b)},
                           (first, second)))
    vectors = [p for p, k in kinds.items() if k.vector and base[p] is not None]
    if len(vectors) >= 2:
        param = vectors[0]
        two = [True, False] if param == "success_mask" else [0.5, 0.5]
        out.append(BadCall(name, f"{param}+outcomes", "shapes", {**base, param: two},
                           tuple(vectors)))
    if takes_calibration_keywords(func):
        for key, bads in CAL_BAD.items():
            for label, value in bads.items():
                out.append(BadCall(name, key, label, {**base, key: value}, (key,)))
    return out


def outcome(call: BadCall, func: Callable[..., Any]) -> str:
    """``"clear"`` or a description of what went wrong."""
    try:
        with np.errstate(all="ignore"):
            func(**call.kwargs)
    except ValueError as err:
        text = str(err)
        if any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text)
               for n in call.names):
            return "clear"
        return f"ValueError without the parameter name: {text[:120]}"
    except Exception as err:  # noqa: BLE001 - any other exception is the finding
        return f"{type(err).__name__}: {str(err)[:120]}"
    return "accepted (no error)"


def _arrays(result: Any) -> list[np.ndarray]:
    if isinstance(result, np.ndarray):
        return [result]
    if isinstance(result, tuple | list):
        return [a for item in result for a in _arrays(item)]
    if is_dataclass(result):
        return [a for f in fields(result) for a in _arrays(getattr(result, f.name))]
    return []


def empty_calls(name: str, func: Callable[..., Any]) -> list[tuple[str, dict[str, Any]]]:
    base = valid_call(name, func)
    out = []
    for param, kind in kinds_of(name, func).items():
        if kind.elementwise:
            out.append((param, {**base, param: np.array([])}))
        elif kind.vector and base[param] is not None and param != "success_mask":
            out.append((param, {**base, param: np.zeros((0, len(base[param])))}))
    return out


def tally() -> dict[str, Any]:
    funcs = public_callables()
    per_function: dict[str, list[int]] = {}
    failures = []
    for name, func in sorted(funcs.items()):
        try:
            calls = bad_calls(name, func)
        except KeyError as err:  # a parameter without a kind: see the spec test
            failures.append((name, str(err), "no spec", "not counted"))
            continue
        results = [outcome(c, func) for c in calls]
        per_function[name] = [sum(r == "clear" for r in results), len(results)]
        failures += [(c.function, c.parameter, c.label, r)
                     for c, r in zip(calls, results, strict=True) if r != "clear"]
    clear = sum(v[0] for v in per_function.values())
    total = sum(v[1] for v in per_function.values())
    return {"functions": len(funcs), "bad_calls": total, "clear_errors": clear,
            "share": clear / total, "per_function": per_function, "failures": failures}


# ----------------------------------------------------------------------- tests
FUNCS = public_callables()


def test_every_public_callable_has_a_spec():
    unknown = {}
    for name, func in FUNCS.items():
        try:
            kinds_of(name, func)
        except KeyError as err:
            unknown[name] = str(err)
    assert not unknown, f"give these parameters a kind in KINDS or OVERRIDES: {unknown}"
    assert len(FUNCS) >= 60, sorted(FUNCS)


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_valid_call_works(name):
    func = FUNCS[name]
    with np.errstate(invalid="raise"):  # no NaN made along the way
        func(**valid_call(name, func))


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_every_bad_call_is_a_clear_error(name):
    func = FUNCS[name]
    wrong = [(c.parameter, c.label, outcome(c, func)) for c in bad_calls(name, func)]
    wrong = [w for w in wrong if w[2] != "clear"]
    assert not wrong, wrong


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_empty_arrays_give_empty_results(name):
    func = FUNCS[name]
    for param, kwargs in empty_calls(name, func):
        try:
            result = func(**kwargs)
        except ValueError as err:
            # only functions of one policy or one number may refuse an empty batch
            assert param in str(err), (param, str(err))
            assert "single" in str(err) or "1-D" in str(err), (param, str(err))
            continue
        if name in BATCH_FREE_FIELDS:  # e.g. the stage index of each step
            result = {k: v for k, v in vars(result).items() if k not in BATCH_FREE_FIELDS[name]}
            result = tuple(result.values())
        arrays = _arrays(result)
        assert arrays and all(a.size == 0 for a in arrays), (param, result)


# Random bad values: an otherwise valid array with one entry made bad, a bad
# scalar of a random value, or a random string, for a random parameter.
def _bad_number(kind: Kind) -> st.SearchStrategy[Any]:
    """NaN, a non-number, or a float outside the kind's range."""
    options = [st.just(NAN), st.text(max_size=4), st.booleans(), st.none()]
    if "below" in kind.bad or "negative" in kind.bad:
        options.append(st.floats(max_value=-1e-300, allow_nan=False))
    if "zero" in kind.bad:
        options.append(st.just(0.0))
    if "above" in kind.bad:
        options.append(st.floats(min_value=1.0 + 1e-9, allow_nan=False))
    if "inf" in kind.bad:
        options.append(st.just(INF))
    return st.one_of(*options)


def _bad_for(kind: Kind) -> st.SearchStrategy[Any]:
    if kind.elementwise and kind.valid is not None:
        def plant(shape: tuple[int, ...], index: int, bad: Any) -> Any:
            if isinstance(bad, str | bool) or bad is None:
                return bad
            arr = np.full(shape, float(kind.valid))
            arr.flat[index % arr.size] = bad
            return arr
        return st.builds(plant, st.tuples(st.integers(1, 3), st.integers(1, 3)),
                         st.integers(0, 8), _bad_number(kind))
    if kind.bad.get("float") == 2.5:  # counts
        return st.one_of(st.floats(allow_nan=True).filter(lambda x: not float(x).is_integer()),
                         st.integers(max_value=-1), st.text(max_size=3), st.booleans())
    if isinstance(kind.valid, str):  # choices
        return st.text(max_size=8).filter(lambda s: s != kind.valid and s not in (
            "mean_std", "mean_only", "sqrt", "std", "exact", "k1", "k2", "k3", "k3_ratio"))
    if kind.vector:
        def spoil(weights: list[float], index: int, bad: float) -> list[float]:
            total = sum(weights)
            vec = [w / total for w in weights]
            vec[index % len(vec)] = bad
            return vec
        return st.builds(spoil, st.lists(st.floats(0.1, 1.0), min_size=3, max_size=3),
                         st.integers(0, 2), st.sampled_from([NAN, -0.3, INF, 2.0]))
    return st.sampled_from(list(kind.bad.values()))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize("name", sorted(FUNCS))
def test_random_bad_values_are_clear_errors(name, data):
    func = FUNCS[name]
    kinds = kinds_of(name, func)
    param = data.draw(st.sampled_from(sorted(kinds)), label="parameter")
    kind = kinds[param]
    value = data.draw(_bad_for(kind), label="value")
    if kind.vector and param == "success_mask":
        value = data.draw(st.sampled_from(list(kind.bad.values())), label="mask")
    call = BadCall(name, param, "random", {**valid_call(name, func), param: value}, (param,))
    if kind.vector:  # a malformed policy may be reported by the parameter it must match
        call = BadCall(name, param, "random", call.kwargs,
                       tuple(p for p, k in kinds.items() if k.vector))
    result = outcome(call, func)
    assert result == "clear", (param, value, result)


if __name__ == "__main__":  # the tally for the issue report
    import json
    import resource
    import signal

    # code that does not check its input may try to allocate or loop without end: cap
    # the memory (MemoryError) and give every call a few seconds (counted as not clear)
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.RLIM_INFINITY))

    def _too_slow(signum: int, frame: object) -> None:
        raise TimeoutError("no answer within 20 s")

    signal.signal(signal.SIGALRM, _too_slow)
    _outcome = outcome

    def outcome(call: BadCall, func: Callable[..., Any]) -> str:  # noqa: F811
        signal.alarm(20)
        try:
            return _outcome(call, func)
        finally:
            signal.alarm(0)

    report = tally()
    json.dump({k: v for k, v in report.items() if k != "failures"}, sys.stdout, indent=1)
    print()
    for failure in report["failures"]:
        print(" | ".join(str(x) for x in failure))
    print(f"clear errors: {report['clear_errors']} of {report['bad_calls']} bad calls "
          f"({100 * report['share']:.1f}%) over {report['functions']} callables")
