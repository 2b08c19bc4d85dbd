"""Numerical theory of GRPO with verifiable rewards (Mroueh, arXiv 2503.06639v4).

Modules (all under ``grpo_companion.theory``):

- ``calibration``: weights ``w+``, ``w-`` and ``Omega`` of each variant
  (eqs. 3, 4, 13), the :class:`Calibration` object shared with the trainer.
- ``finite_group``: exact expected weights for a group of ``G`` samples.
- ``policies``: closed-form optimal policies (Theorems 1, 4, 8; Lemmas 2, 3).
- ``dynamics``: PoS recurrences of Table 1 in logit space, derivatives, Lemma 1.
- ``roots``: all interior fixed points, vectorised over parameter grids.
- ``regimes``: period-2 orbits and long-run regime classification.
"""

from .calibration import Calibration, omega, omega_of_logit, weights
from .dynamics import (
    iterate,
    iterate_logit,
    pos_map,
    pos_map_derivative,
    pos_map_logit,
    pos_map_logit_derivative,
    stability_bound,
)
from .logistic import expit, log_bernoulli_variance, logit, sigmoid
from .policies import (
    anchored_policy,
    geometric_anchor,
    kl_divergence,
    optimal_policy,
    policy_iterate,
    pos,
    renyi_correction,
    renyi_divergence,
)
from .regimes import (
    DynamicsResult,
    Regime,
    classify_dynamics,
    period_two_orbits,
    period_two_orbits_logit,
)
from .roots import fixed_points, fixed_points_logit

__all__ = [
    "Calibration",
    "DynamicsResult",
    "Regime",
    "anchored_policy",
    "classify_dynamics",
    "expit",
    "fixed_points",
    "fixed_points_logit",
    "geometric_anchor",
    "iterate",
    "iterate_logit",
    "kl_divergence",
    "log_bernoulli_variance",
    "logit",
    "omega",
    "omega_of_logit",
    "optimal_policy",
    "period_two_orbits",
    "period_two_orbits_logit",
    "policy_iterate",
    "pos",
    "pos_map",
    "pos_map_derivative",
    "pos_map_logit",
    "pos_map_logit_derivative",
    "renyi_correction",
    "renyi_divergence",
    "sigmoid",
    "stability_bound",
    "weights",
]
