"""Numerical theory of GRPO with verifiable rewards (Mroueh, arXiv 2503.06639v4).

Core modules (the theory every chapter and the trainer use; exported here):

- ``normalizations``: the registry; each reward normalisation is one function,
  what a group of ``n`` with ``k`` successes gives a success and a failure.
- ``calibration``: weights ``w+``, ``w-`` and ``Omega`` of each calibration
  (eqs. 3, 4, 13), derived from that definition; the :class:`Calibration`
  object shared with the symbolic layer and the trainer.
- ``variants``: :class:`Anchor` (reference, mirror, two-KL with ``alpha``),
  :class:`Variant` (calibration x anchor) and the named ``CALIBRATIONS``.
- ``finite_group``: exact expected weights for a group of ``G`` samples.
- ``policies``: closed-form optimal policies (Theorems 1, 4, 8; Lemmas 2, 3).
- ``dynamics``: PoS recurrences of Table 1 in logit space, derivatives, Lemma 1.
- ``roots``: all interior fixed points, vectorised over parameter grids.
- ``regimes``: period-2 orbits and long-run regime classification.
- ``logistic``: logit-space helpers (the argument checks are ``grpo_companion.validation``).
- ``audit``: the census of a calibration's fixed points (does Theorem 3 hold for it?).
- ``group_sampling``: Monte Carlo groups of ``G`` samples (ch. 6); ``group_advantages``.
- ``kl_estimators``: the per-sample KL estimators (k1, k2, k3, k3_ratio) and the fixed point
  each makes sampled GRPO reach; the trainer reads its estimators.
- ``_group_kernels``: private numerical kernels shared by ``calibration`` and
  ``finite_group``.

Chapter analyses live in the subpackage :mod:`grpo_companion.theory.analyses`, one module per
chapter result (its docstring lists which chapter each serves); import them by module name,
``from grpo_companion.theory.analyses import table1``. A core module never imports them.
"""

# a core module that no export names: theory.finite_group after `import theory`
from . import finite_group as finite_group
from .audit import audit_calibration
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
from .group_sampling import group_advantages
from .logistic import log_bernoulli_variance, logit, sigmoid
from .normalizations import NORMALIZATIONS, register_normalization, unregister_normalization
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
from .variants import CALIBRATIONS, Anchor, Variant

__all__ = [
    "CALIBRATIONS",
    "NORMALIZATIONS",
    "Anchor",
    "Calibration",
    "Variant",
    "DynamicsResult",
    "Regime",
    "anchored_policy",
    "audit_calibration",
    "classify_dynamics",
    "fixed_points",
    "fixed_points_logit",
    "geometric_anchor",
    "group_advantages",
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
    "register_normalization",
    "renyi_correction",
    "renyi_divergence",
    "sigmoid",
    "stability_bound",
    "unregister_normalization",
    "weights",
]
