"""SymPy derivations of the paper's results, returning expressions the book displays.

Modules
-------
symbols      shared symbols ``p, p_ref, beta, eps, alpha, clip_eps`` and helpers
calibration  Bernoulli moments and calibration weights (eqs. 1, 3, 4, 13)
contrastive  clipped/unclipped contrastive form of the objective (Section 2.2-2.3)
policy       Lagrange solution of the KL step and PoS maps (Theorems 1, 2, 4, 8; Prop. 1)
two_kl       geometric-mean anchor and Renyi correction (Lemmas 2-3, Theorem 9), moving reference
dynamics     derivatives, stability, amplification, Dr. GRPO, beta_eff (Sections 3-5)
"""

from .calibration import (
    CalibrationWeights,
    GroupWeights,
    bernoulli_moments,
    calibration_weights,
    equal_total_weight,
    group_weights,
    mean_advantage,
    unsmoothed_whitening,
)
from .contrastive import (
    clipped_surrogate,
    clipped_surrogate_by_sign,
    contrastive_identity,
)
from .dynamics import (
    amplification,
    beta_eff_equivalence,
    dr_grpo,
    fixed_point_equation,
    lemma1_derivative,
    map_derivative,
    mirror_increment,
    sigmoid_derivative,
    stability_bound,
    two_kl_fixed_point,
)
from .policy import optimal_policy, pos_map, theorem2_map
from .symbols import LAMBDA_ARGS, alpha, beta, clip_eps, eps, lambdify, logit, p, p_ref, sigmoid
from .two_kl import (
    conditional_invariance,
    geometric_mean_identity,
    geometric_mean_pos,
    moving_reference,
    policy_fixed_point,
    renyi_divergence,
    two_kl_step,
)

__all__ = [
    "LAMBDA_ARGS",
    "CalibrationWeights",
    "GroupWeights",
    "alpha",
    "amplification",
    "bernoulli_moments",
    "beta",
    "beta_eff_equivalence",
    "calibration_weights",
    "clip_eps",
    "clipped_surrogate",
    "clipped_surrogate_by_sign",
    "conditional_invariance",
    "contrastive_identity",
    "dr_grpo",
    "eps",
    "equal_total_weight",
    "fixed_point_equation",
    "geometric_mean_identity",
    "geometric_mean_pos",
    "group_weights",
    "lambdify",
    "lemma1_derivative",
    "logit",
    "map_derivative",
    "mean_advantage",
    "mirror_increment",
    "moving_reference",
    "optimal_policy",
    "p",
    "p_ref",
    "policy_fixed_point",
    "pos_map",
    "renyi_divergence",
    "sigmoid",
    "sigmoid_derivative",
    "stability_bound",
    "theorem2_map",
    "two_kl_fixed_point",
    "two_kl_step",
    "unsmoothed_whitening",
]
